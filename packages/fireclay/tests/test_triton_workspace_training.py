"""Training through fireclay-triton's kept workspaces (fireclay_triton/wrapper_codegen.py): a
forward's saved tensors and a backward's gradients are never memory a later call reuses.

On a CUDA GPU the model runs there; without one, CPU tensors are routed to fireclay-triton
(``_targets_gpu``) and its kernels run in Triton's interpreter (see conftest). Two forwards run before either backward, so the second
forward's temporaries would overwrite anything of the first the workspace wrongly held; each
step's gradients are kept and checked again after the later steps."""

from __future__ import annotations

import copy
import os

import pytest
import torch
import torch.nn.functional as F

import fireclay
from fireclay.backends import builtin

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
pytestmark = pytest.mark.skipif(DEVICE == "cpu" and os.environ.get("TRITON_INTERPRET") != "1",
                                reason="needs a CUDA GPU or Triton's interpreter (see conftest)")


class Block(torch.nn.Module):
    """Attention and a gated MLP with a residual stream: matmuls whose results die at once, saved
    activations, small weight gradients after large temporaries."""

    def __init__(self, width=16, heads=2):
        super().__init__()
        self.heads = heads
        self.norm = torch.nn.LayerNorm(width)
        self.qkv = torch.nn.Linear(width, 3 * width)
        self.out = torch.nn.Linear(width, width, bias=False)
        self.gate = torch.nn.Linear(width, 2 * width, bias=False)
        self.up = torch.nn.Linear(width, 2 * width, bias=False)
        self.down = torch.nn.Linear(2 * width, width, bias=False)

    def forward(self, x):
        b, s, w = x.shape
        q, k, v = self.qkv(self.norm(x)).view(b, s, 3, self.heads, w // self.heads).permute(2, 0, 3, 1, 4)
        att = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.out(att.transpose(1, 2).reshape(b, s, w))
        h = self.norm(x)
        return x + self.down(F.silu(self.gate(h)) * self.up(h))


@pytest.fixture
def triton_path(monkeypatch, tmp_path):
    """Graphs go to fireclay-triton; yields the wrapper texts of the programs compiled."""
    import fireclay_triton

    monkeypatch.setattr(builtin, "_targets_gpu", lambda example_inputs: True)
    wrappers = []
    real = fireclay_triton.compile_program

    def spy(*args, **kwargs):
        compiled = real(*args, **kwargs)
        wrappers.append(compiled.wrapper_source)
        return compiled

    monkeypatch.setattr(fireclay_triton, "compile_program", spy)
    fireclay.reset()
    with fireclay.config.shared.patch(cache_dir=str(tmp_path)), fireclay.config.patch(background_compile=False):
        yield wrappers
    fireclay.reset()


def _grads(model):
    return [p.grad.clone() for p in model.parameters()]


def test_two_forwards_before_their_backwards_match_eager(triton_path):
    torch.manual_seed(0)
    model = Block().to(DEVICE)
    reference = copy.deepcopy(model)
    compiled = fireclay.compile(model)
    kept = []
    for _ in range(2):
        xs = [torch.randn(2, 6, 16, device=DEVICE) for _ in range(2)]
        outs = [compiled(x) for x in xs]  # both forwards first: the first's saved tensors must survive
        want = [reference(x) for x in xs]
        for o, e in zip(outs, want):
            torch.testing.assert_close(o, e, rtol=1e-4, atol=1e-5)
        kept_outs = [o.detach().clone() for o in outs]
        projections = [torch.randn_like(o) for o in outs]
        for o, e, r in zip(reversed(outs), reversed(want), reversed(projections)):
            model.zero_grad()
            reference.zero_grad()
            (o * r).sum().backward()
            (e * r).sum().backward()
            for p, q in zip(model.parameters(), reference.parameters()):
                torch.testing.assert_close(p.grad, q.grad, rtol=1e-4, atol=1e-5)
            kept.append((_grads(model), [p.grad for p in model.parameters()]))
        for o, c in zip(outs, kept_outs):  # the backwards wrote nothing the outputs use
            assert torch.equal(o.detach(), c)
    for copies, grads in kept:  # each backward returned gradients of its own memory
        for c, g in zip(copies, grads):
            assert torch.equal(c, g)
    assert len(triton_path) == 2 and all("workspace" in text for text in triton_path)  # forward, backward
