"""The C++ backend builds every aten graph of a small set of models that covers the patterns that
have broken its builds: rotary embeddings (whole-head and partial, rotate-half written with `cat`),
grouped-query attention, T5's relative position bias, convolutions (plain and depthwise), pooling
of a 1x1 feature map (a reduction over extent-1 dimensions fused with a layer norm) and FNet's
Fourier transforms (complex tensors).

A graph whose C++ does not build still gives the right answer (it runs in the interpreter, with a
warning), so correctness alone cannot see such a failure: each case here also asserts that no
graph fell back, and that at least one graph was compiled at all.
"""

from __future__ import annotations

import logging

import pytest
import torch

import fireclay

transformers = pytest.importorskip("transformers")

VOCAB = 64
_FALLBACK = "code generation failed"


def _decoder(config_name: str, model_name: str, **extra):
    def build():
        config = getattr(transformers, config_name)(
            vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=4,
            num_key_value_heads=2, max_position_embeddings=64, pad_token_id=0, bos_token_id=1, eos_token_id=2,
            **extra)
        return getattr(transformers, model_name)(config), {"input_ids": torch.randint(1, VOCAB, (2, 8)),
                                                           "use_cache": False}
    return build


def _t5():
    config = transformers.T5Config(vocab_size=VOCAB, d_model=32, d_kv=8, d_ff=64, num_layers=1, num_heads=4,
                                   relative_attention_num_buckets=8, dropout_rate=0.0, decoder_start_token_id=0, pad_token_id=0)
    return transformers.T5Model(config), {"input_ids": torch.randint(1, VOCAB, (2, 8)),
                                          "decoder_input_ids": torch.randint(1, VOCAB, (2, 5)), "use_cache": False}


def _resnet():
    config = transformers.ResNetConfig(embedding_size=8, hidden_sizes=[8, 16], depths=[1, 1], layer_type="basic")
    return transformers.ResNetModel(config), {"pixel_values": torch.randn(2, 3, 32, 32)}


def _convnext():
    config = transformers.ConvNextConfig(hidden_sizes=[8, 16], depths=[1, 1], num_stages=2, patch_size=2,
                                         image_size=16)
    return transformers.ConvNextModel(config), {"pixel_values": torch.randn(2, 3, 16, 16)}


def _convnext_pooling_one_pixel():
    # the last stage is 1x1: the pooling reduces over extent-1 dimensions, then a layer norm
    config = transformers.ConvNextConfig(hidden_sizes=[8, 16], depths=[1, 1], num_stages=2, patch_size=4,
                                         image_size=8)
    return transformers.ConvNextModel(config), {"pixel_values": torch.randn(2, 3, 8, 8)}


def _focalnet():
    config = transformers.FocalNetConfig(embed_dim=8, depths=[1, 1], focal_levels=[2, 2], focal_windows=[3, 3],
                                         patch_size=4, image_size=8)
    return transformers.FocalNetModel(config), {"pixel_values": torch.randn(2, 3, 8, 8)}


def _fnet():
    config = transformers.FNetConfig(vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                                     max_position_embeddings=64, pad_token_id=0)
    return transformers.FNetModel(config), {"input_ids": torch.randint(1, VOCAB, (2, 8))}


MODELS = {
    "llama": _decoder("LlamaConfig", "LlamaModel"),  # rotary embeddings, grouped-query attention
    "phi3": _decoder("Phi3Config", "Phi3Model"),  # the whole head rotated: `cat` with an empty part
    "phi3_partial": _decoder("Phi3Config", "Phi3Model", partial_rotary_factor=0.5),
    "qwen2": _decoder("Qwen2Config", "Qwen2Model"),  # q/k/v projections with bias
    "t5": _t5,  # relative position bias
    "resnet": _resnet,  # convolutions with batch norm
    "convnext": _convnext,  # depthwise convolutions, layer norm over channels
    "convnext_1x1": _convnext_pooling_one_pixel,  # a reduction over extent-1 dimensions, fused
    "focalnet": _focalnet,  # the same, after focal modulation
    "fnet": _fnet,  # complex tensors: Fourier transforms stay library calls
}
TRAINED = ["phi3", "t5", "resnet"]  # their backward graphs too


def _tensors(out) -> list[torch.Tensor]:
    values = out.to_tuple() if hasattr(out, "to_tuple") else out
    return [v for v in (values if isinstance(values, (tuple, list)) else [values]) if isinstance(v, torch.Tensor)]


class _CountingBackend:
    """The fireclay backend, counting the graphs it is handed."""

    def __init__(self):
        self.graphs = 0

    def __call__(self, program, example_inputs, *args, **kwargs):
        self.graphs += 1
        return fireclay.lookup_backend("fireclay")(program, example_inputs, *args, **kwargs)


def _compiled(model, caplog):
    backend = _CountingBackend()
    caplog.set_level(logging.WARNING, logger="fireclay")
    return fireclay.compile(model, backend=backend), backend


def _assert_every_graph_built(backend, caplog):
    fallbacks = [r.getMessage() for r in caplog.records if _FALLBACK in r.getMessage()]
    assert not fallbacks, fallbacks
    assert backend.graphs >= 1


@pytest.mark.parametrize("name", list(MODELS))
def test_inference_builds_every_graph_and_matches_eager(name, caplog):
    torch.manual_seed(0)
    model, kwargs = MODELS[name]()
    model.eval()
    compiled, backend = _compiled(model, caplog)
    with torch.no_grad():
        got, want = _tensors(compiled(**kwargs)), _tensors(model(**kwargs))
    _assert_every_graph_built(backend, caplog)
    assert len(got) == len(want)
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("name", TRAINED)
def test_training_builds_every_graph_and_matches_eager(name, caplog):
    torch.manual_seed(0)
    model, kwargs = MODELS[name]()
    model.train()
    compiled, backend = _compiled(model, caplog)
    _tensors(compiled(**kwargs))[0].pow(2).mean().backward()
    got = [p.grad.clone() for p in model.parameters()]
    model.zero_grad()
    _tensors(model(**kwargs))[0].pow(2).mean().backward()
    _assert_every_graph_built(backend, caplog)
    for g, p in zip(got, model.parameters()):
        torch.testing.assert_close(g, p.grad, rtol=1e-3, atol=1e-4)
