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
    _check_gpt2_with_labels(fireclay.compile(model, backend=backend, fullgraph=True), model)


def _check_gpt2_with_labels(compiled, model):
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


def _gemma2():
    c = transformers
    return c.Gemma2Model(c.Gemma2Config(vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                        num_attention_heads=4, num_key_value_heads=2, head_dim=8, sliding_window=4,
                                        pad_token_id=0))


def _clip():
    c = transformers
    text = c.CLIPTextConfig(vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                            num_attention_heads=4, max_position_embeddings=16, projection_dim=16)
    vision = c.CLIPVisionConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=4,
                                image_size=16, patch_size=8, projection_dim=16)
    return c.CLIPModel(c.CLIPConfig(text_config=text.to_dict(), vision_config=vision.to_dict(), projection_dim=16))


def test_gemma2_attention_registry_lookup_is_one_graph_and_matches_eager():
    # Its attention function comes from a Mapping.get over a __getitem__ that raises KeyError.
    torch.manual_seed(0)
    model = _gemma2().eval()
    model.config._attn_implementation = "eager"
    compiled = fireclay.compile(model, backend="aot_eager", fullgraph=True)
    for _ in range(2):
        ids = torch.randint(1, VOCAB, (2, 9))
        with torch.no_grad():
            got, want = compiled(ids), model(ids)
        torch.testing.assert_close(got.last_hidden_state, want.last_hidden_state, rtol=1e-4, atol=1e-4)


def test_clip_projections_written_on_model_outputs_are_one_graph_and_match_eager():
    # get_image_features / get_text_features assign pooler_output on a ModelOutput built in forward.
    torch.manual_seed(0)
    model = _clip().eval()
    compiled = fireclay.compile(model, backend="aot_eager", fullgraph=True)
    ids, pixels = torch.randint(1, VOCAB, (2, 7)), torch.randn(2, 3, 16, 16)
    with torch.no_grad():
        got, want = compiled(input_ids=ids, pixel_values=pixels), model(input_ids=ids, pixel_values=pixels)
    assert list(got.keys()) == list(want.keys())
    for a, b in zip(_outputs(got), _outputs(want)):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-4)


def _paligemma():
    c = transformers
    text = c.GemmaConfig(vocab_size=VOCAB + 8, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                         num_attention_heads=2, num_key_value_heads=1, head_dim=16)
    vision = c.SiglipVisionConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2,
                                  image_size=16, patch_size=8, projection_dim=32)
    return c.PaliGemmaModel(c.PaliGemmaConfig(text_config=text.to_dict(), vision_config=vision.to_dict(),
                                              image_token_index=VOCAB + 4, projection_dim=32))


@pytest.mark.parametrize("prefix", [False, True], ids=["text_only", "with_token_type_ids"])
def test_paligemma_matches_the_compile_path_of_transformers(prefix, monkeypatch):
    # PaliGemma's text model attends bidirectionally (use_bidirectional_attention) but its mask
    # is causal. In eager, transformers reads the position ids' values, finds no packed
    # sequences and drops the mask, so attention is bidirectional; while compiling it cannot read
    # values, keeps the causal mask, and TorchDynamo's graph gives the causal answer. With
    # token_type_ids (how PaliGemma is used) both paths build the same mask and agree.
    import transformers.masking_utils as masking

    torch.manual_seed(0)
    model = _paligemma().eval()
    ids = torch.randint(1, VOCAB, (2, 8))
    kwargs = {"token_type_ids": torch.cat([torch.zeros(2, 3), torch.ones(2, 5)], 1).long()} if prefix else {}
    compiled = fireclay.compile(model, backend="aot_eager", fullgraph=True)
    with torch.no_grad():
        got = compiled(input_ids=ids, **kwargs).last_hidden_state
        eager = model(input_ids=ids, **kwargs).last_hidden_state
        monkeypatch.setattr(masking, "is_tracing", lambda *a: True)
        compile_path = model(input_ids=ids, **kwargs).last_hidden_state
    torch.testing.assert_close(got, compile_path, rtol=1e-4, atol=1e-4)
    if prefix:
        torch.testing.assert_close(got, eager, rtol=1e-4, atol=1e-4)
    else:
        assert (got - eager).abs().max() > 1e-2  # the difference is transformers', not the compiler's


def test_gpt2_with_labels_through_torch_compile_max_autotune_has_no_fallback(caplog):
    """Through ``torch.compile(backend="fireclay", mode="max-autotune")`` the graph count is
    TorchDynamo's own (it breaks once in the loss path); fireclay compiles each of its graphs, with
    no fallback to eager or the interpreter (a fallback always logs a warning), and matches eager."""
    import logging

    torch._dynamo.reset()
    torch.manual_seed(0)
    model = _gpt2_lm().eval()
    compiled = torch.compile(model, backend="fireclay", mode="max-autotune")
    with caplog.at_level(logging.WARNING, logger="fireclay"):
        _check_gpt2_with_labels(compiled, model)
    assert not [r for r in caplog.records if r.name.startswith("fireclay")], caplog.text
    torch._dynamo.reset()
