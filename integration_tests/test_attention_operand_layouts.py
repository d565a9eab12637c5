"""Fused attention after a layout change (issue 20): SAM2's Hiera backbone max-pools its query in
NCHW views of channels-last memory, so eager hands `_scaled_dot_product_flash_attention_for_cpu`
heads with a dense last dimension; a compiled program that stored the pooled query NCHW gave the
kernel a strided last dimension, which it reads unchecked: wrong values in one graph, no error.
Checked through the C++ backend (forward and backward), Triton's interpreter, and SAM2's vision
model at a tiny size against eager."""

import json
import os
import subprocess
import sys

import pytest
import torch

import fireclay
from fireclay_autograd import aot_backend

MODULE = r"""
import torch


class PooledQueryAttention(torch.nn.Module):
    # Hiera's query pooling: a 2x2 max-pool of the query in NCHW, then attention over heads
    def __init__(self):
        super().__init__()
        self.qkv = torch.nn.Linear(8, 24)

    def forward(self, x):
        b, h, w, _ = x.shape
        q, k, v = self.qkv(x).reshape(b, h * w, 3, 2, 4).unbind(2)
        q = torch.nn.functional.max_pool2d(q.reshape(b, h, w, 8).permute(0, 3, 1, 2), 2, 2)
        q = q.permute(0, 2, 3, 1).reshape(b, -1, 2, 4)
        return torch.nn.functional.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2),
                                                                v.transpose(1, 2))


def forward_and_backward_errors(backend):
    import fireclay

    torch.manual_seed(0)
    model = PooledQueryAttention()
    compiled = fireclay.compile(model, backend=backend, fullgraph=True)
    errors = []
    for _ in range(2):
        x = torch.randn(2, 4, 4, 8, requires_grad=True)
        got, want = compiled(x), model(x)
        seed = torch.randn_like(want)
        (got_grad,) = torch.autograd.grad((got * seed).sum(), x)
        (want_grad,) = torch.autograd.grad((want * seed).sum(), x)
        errors += [(got - want).abs().max().item(), (got_grad - want_grad).abs().max().item()]
    return errors
"""

TRITON_SCRIPT = MODULE + r"""
from fireclay_autograd import aot_backend
from fireclay_triton import triton_backend
import json
print(json.dumps(forward_and_backward_errors(aot_backend(triton_backend, triton_backend))))
"""

_namespace: dict = {}
exec(compile(MODULE, "pooled_query_attention", "exec"), _namespace)


def test_pooled_query_attention_through_cpp_matches_eager():
    from fireclay_cpp import cpp_backend

    errors = _namespace["forward_and_backward_errors"](aot_backend(cpp_backend, cpp_backend))
    assert max(errors) < 1e-5, errors


def test_pooled_query_attention_through_interpreted_triton_matches_eager(tmp_path):
    pytest.importorskip("triton")
    env = dict(os.environ, TRITON_INTERPRET="1", FIRECLAY_CACHE_DIR=str(tmp_path))
    done = subprocess.run([sys.executable, "-c", TRITON_SCRIPT], env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    errors = json.loads(done.stdout.strip().splitlines()[-1])
    assert max(errors) < 1e-5, errors


def _tiny_sam2_vision():
    transformers = pytest.importorskip("transformers")
    cfg = transformers.Sam2VisionConfig()
    backbone = dict(hidden_size=16, num_attention_heads=1, blocks_per_stage=[1, 1, 2, 1],
                    embed_dim_per_stage=[16, 32, 64, 128], num_attention_heads_per_stage=[1, 1, 1, 1],
                    image_size=[64, 64], window_size_per_stage=[4, 4, 4, 4], global_attention_blocks=[3],
                    window_positional_embedding_background_size=[4, 4])
    for key, value in backbone.items():
        setattr(cfg.backbone_config, key, value)
    cfg.backbone_channel_list, cfg.fpn_hidden_size = [128, 64, 32, 16], 32
    cfg.backbone_feature_sizes = [[16, 16], [8, 8], [4, 4]]
    return transformers.Sam2VisionModel(cfg).eval()


def _flat(out) -> list:
    flat = []
    for v in out.to_tuple():
        flat += list(v) if isinstance(v, (tuple, list)) else [v]
    return flat


def test_sam2_vision_model_is_one_graph_and_matches_eager():
    from fireclay_cpp import cpp_backend

    torch.manual_seed(0)
    model = _tiny_sam2_vision()
    graphs = []

    def counting(program, example_inputs):
        graphs.append(program)
        return aot_backend(cpp_backend, cpp_backend)(program, example_inputs)

    compiled = fireclay.compile(model, backend=counting, fullgraph=True)
    for _ in range(2):
        pixels = torch.randn(1, 3, 64, 64)
        with torch.no_grad():
            got, want = _flat(compiled(pixel_values=pixels)), _flat(model(pixel_values=pixels))
        assert len(got) == len(want) == 7
        for a, b in zip(got, want):
            torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-4)
    assert len(graphs) == 1
