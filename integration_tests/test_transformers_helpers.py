"""Hugging Face models whose transformers 5.x helpers used to send the whole model to eager
(issue 20/24): T5Model (its decoder deep-copies the config to build its cache) and GPT-2 with
labels (the loss path logs through ``logger.warning_once`` and pads the labels). Each must be one
graph with no eager frame (``fullgraph=True`` raises otherwise) and match eager."""

import pytest
import torch

import fireclay

transformers = pytest.importorskip("transformers")

VOCAB = 96


def _t5():
    c = transformers
    return c.T5Model(c.T5Config(vocab_size=VOCAB, d_model=32, d_kv=8, d_ff=64, num_layers=1, num_decoder_layers=1,
                                num_heads=4, decoder_start_token_id=0))


def _gpt2_lm():
    c = transformers
    return c.GPT2LMHeadModel(c.GPT2Config(vocab_size=VOCAB, n_embd=32, n_layer=1, n_head=4, n_positions=64,
                                          bos_token_id=0, eos_token_id=0))


def _outputs(out):
    return [t for t in out.to_tuple() if isinstance(t, torch.Tensor)]


@pytest.mark.parametrize("backend", ["aot_eager", "fireclay"])
def test_gpt2_with_labels_is_one_graph_and_matches_eager(backend):
    torch.manual_seed(0)
    model = _gpt2_lm().eval()
    compiled = fireclay.compile(model, backend=backend, fullgraph=True)
    for _ in range(2):
        ids = torch.randint(0, VOCAB, (2, 10))
        with torch.no_grad():
            got, want = compiled(ids, labels=ids), model(ids, labels=ids)
        torch.testing.assert_close(got.loss, want.loss, rtol=1e-4, atol=1e-4)
        torch.testing.assert_close(got.logits, want.logits, rtol=1e-4, atol=1e-4)


def test_t5_model_is_one_graph_and_matches_eager():
    torch.manual_seed(0)
    model = _t5().eval()
    compiled = fireclay.compile(model, backend="aot_eager", fullgraph=True)
    for _ in range(2):
        ids, dec = torch.randint(0, VOCAB, (2, 9)), torch.randint(0, VOCAB, (2, 5))
        with torch.no_grad():
            got = compiled(input_ids=ids, decoder_input_ids=dec)
            want = model(input_ids=ids, decoder_input_ids=dec)
        assert len(_outputs(got)) == len(_outputs(want))
        for a, b in zip(_outputs(got), _outputs(want)):
            torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-4)
        assert type(got.past_key_values) is type(want.past_key_values)
