"""Fused attention on CUDA: every SDPA backend torch can pick (cuDNN, flash, memory-efficient, math),
with and without masks, causal or not, in bfloat16, float16 and float32, inference and a training
step, through fireclay against eager. Each backend is forced with `torch.nn.attention.sdpa_kernel`
for eager and compiled code alike, so the compiled graph keeps the same fused kernel (an extern
call with that kernel's own output metadata) that eager runs.
"""

from __future__ import annotations

import itertools

import pytest
import torch

import fireclay

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")]

BACKENDS = ("cudnn", "flash", "efficient", "math")
DTYPES = (torch.bfloat16, torch.float16, torch.float32)
MASKS = ("none", "causal", "additive")


class Attention(torch.nn.Module):
    def __init__(self, width: int, heads: int, mask: str):
        super().__init__()
        self.heads, self.mask = heads, mask
        self.qkv = torch.nn.Linear(width, 3 * width)
        self.out = torch.nn.Linear(width, width)

    def forward(self, x, bias):
        batch, seq, width = x.shape
        q, k, v = self.qkv(x).view(batch, seq, 3, self.heads, width // self.heads).permute(2, 0, 3, 1, 4)
        attn = torch.nn.functional.scaled_dot_product_attention(
            q, k, v, attn_mask=bias if self.mask == "additive" else None, is_causal=self.mask == "causal")
        return self.out(attn.transpose(1, 2).reshape(batch, seq, width))


def _supported(backend: str, dtype: torch.dtype, mask: str) -> bool:
    if backend in ("cudnn", "flash") and dtype == torch.float32:
        return False  # 16-bit only
    if backend == "flash" and mask == "additive":
        return False  # no arbitrary masks
    return True


def _kernel(backend: str):
    from torch.nn.attention import SDPBackend, sdpa_kernel

    chosen = {"cudnn": SDPBackend.CUDNN_ATTENTION, "flash": SDPBackend.FLASH_ATTENTION,
              "efficient": SDPBackend.EFFICIENT_ATTENTION, "math": SDPBackend.MATH}[backend]
    return sdpa_kernel([chosen])


CASES = [(b, d, m, t) for b, d, m, t in itertools.product(BACKENDS, DTYPES, MASKS, (False, True))
         if _supported(b, d, m)]


@pytest.mark.parametrize("backend,dtype,mask,training", CASES,
                         ids=[f"{b}-{str(d)[6:]}-{m}-{'train' if t else 'infer'}" for b, d, m, t in CASES])
def test_sdpa_backend_against_eager_cuda(backend, dtype, mask, training):
    torch.manual_seed(0)
    width, heads, batch, seq = 128, 2, 2, 64
    model = Attention(width, heads, mask).to("cuda", dtype)
    compiled_model = Attention(width, heads, mask).to("cuda", dtype)
    compiled_model.load_state_dict(model.state_dict())
    x = torch.randn(batch, seq, width, device="cuda", dtype=dtype, requires_grad=training)
    bias = torch.randn(batch, heads, seq, seq, device="cuda", dtype=dtype)
    x_compiled = x.detach().clone().requires_grad_(training)
    compiled = fireclay.compile(compiled_model, fullgraph=True)
    tolerance = {torch.float32: 1e-4, torch.float16: 2e-2, torch.bfloat16: 5e-2}[dtype]
    with _kernel(backend), torch.set_grad_enabled(training):
        expected = model(x, bias)
        got = compiled(x_compiled, bias)
        torch.testing.assert_close(got, expected, atol=tolerance, rtol=tolerance)
        if training:
            grad = torch.randn_like(expected)
            expected.backward(grad)
            got.backward(grad)
    if training:
        torch.testing.assert_close(x_compiled.grad, x.grad, atol=tolerance, rtol=tolerance)
        for (name, p), q in zip(model.named_parameters(), compiled_model.parameters()):
            torch.testing.assert_close(q.grad, p.grad, atol=tolerance, rtol=tolerance, msg=name)
