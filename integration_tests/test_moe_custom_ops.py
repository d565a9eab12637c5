"""Mixture-of-experts models of transformers 5.x route their experts through the
``torch.library`` custom op ``transformers::grouped_mm_fallback`` (and its backward op) while
compiling in float32. Issue 20: the aten stage refused that op and the graph ran in the
interpreter. Each model must be one graph with no fallback (``fullgraph=True`` raises
otherwise) and match eager: outputs, and in training the gradients of every parameter."""

import pytest
import torch

import fireclay

transformers = pytest.importorskip("transformers")

VOCAB = 64


def _ernie_moe():
    c = transformers
    return c.Ernie4_5_MoeModel(c.Ernie4_5_MoeConfig(
        vocab_size=VOCAB, hidden_size=32, intermediate_size=48, moe_intermediate_size=16, num_hidden_layers=1,
        num_attention_heads=4, num_key_value_heads=2, moe_num_experts=4, moe_k=2, moe_layer_start_index=0,
        moe_num_shared_experts=0, max_position_embeddings=64))


def _aria_text():
    c = transformers
    return c.AriaTextModel(c.AriaTextConfig(
        vocab_size=VOCAB, hidden_size=32, intermediate_size=16, num_hidden_layers=1, num_attention_heads=4,
        num_key_value_heads=2, moe_num_experts=4, moe_topk=2, moe_num_shared_experts=1, max_position_embeddings=64))


MODELS = [pytest.param(_ernie_moe, id="ernie4_5_moe"), pytest.param(_aria_text, id="aria_text")]


@pytest.mark.parametrize("build", MODELS)
def test_moe_inference_is_one_graph_and_matches_eager(build):
    torch.manual_seed(0)
    model = build().eval()
    compiled = fireclay.compile(model, fullgraph=True)
    for seed in (0, 1):
        ids = torch.randint(0, VOCAB, (2, 7), generator=torch.Generator().manual_seed(seed))
        with torch.no_grad():
            got, want = compiled(ids), model(ids)
        torch.testing.assert_close(got.last_hidden_state, want.last_hidden_state, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("build", MODELS)
def test_moe_training_is_one_graph_and_matches_eager(build):
    torch.manual_seed(0)
    ours = build().train()
    theirs = build().train()
    theirs.load_state_dict(ours.state_dict())
    compiled = fireclay.compile(ours, fullgraph=True)
    ids = torch.randint(0, VOCAB, (2, 7), generator=torch.Generator().manual_seed(3))
    got, want = compiled(ids).last_hidden_state, theirs(ids).last_hidden_state
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)
    cotangent = torch.randn_like(want)
    got.backward(cotangent)
    want.backward(cotangent)
    for (name, a), b in zip(ours.named_parameters(), theirs.parameters()):
        if b.grad is None:
            assert a.grad is None or not a.grad.any(), name
        else:
            torch.testing.assert_close(a.grad, b.grad, rtol=1e-4, atol=1e-4, msg=name)
