"""Views of computed tensors returned beside values computed after them: the memory a view reads
must not be reused while it is alive. Windows (``Tensor.unfold``, PatchTST's patchify) are index
arithmetic now; a view only a library call makes (``Tensor.view(dtype)``, a bit cast) keeps its
operand's memory alive. Before, both returned values another kernel had overwritten, silently
(PatchTST's ``patch_input``)."""

from __future__ import annotations

import pytest
import torch

import fireclay


def patchify(x, w, size, step):
    s = (x - x.mean(1, keepdim=True)) / (x.std(1, keepdim=True) + 1e-5)
    p = s.transpose(-1, -2).unfold(-1, size, step)
    h = torch.relu(p @ w)
    return torch.tanh(h @ w.t()).sum(-1), p


@pytest.mark.parametrize("size,step", [(4, 2), (1, 1), (5, 5), (3, 1)])
def test_unfolded_windows_match_eager(size, step):
    gen = torch.Generator().manual_seed(size * 10 + step)
    compiled = fireclay.compile(patchify)
    for batch in (2, 3):
        x, w = torch.randn(batch, 32, 3, generator=gen), torch.randn(size, 8, generator=gen)
        got, want = compiled(x, w, size, step), patchify(x, w, size, step)
        for g, e in zip(got, want):
            torch.testing.assert_close(g, e, atol=1e-5, rtol=1e-5)


def bit_cast(x, w, dtype):
    bits = (x * 2).view(dtype)
    h = torch.tanh(torch.relu(x @ w) @ w.t())
    return bits, h * 3


@pytest.mark.parametrize("dtype", [torch.int32, torch.int16, torch.uint8], ids=str)
def test_bit_casts_of_computed_values_match_eager(dtype):
    gen = torch.Generator().manual_seed(7)
    compiled = fireclay.compile(bit_cast)
    for rows in (64, 40):
        x, w = torch.randn(rows, 32, generator=gen), torch.randn(32, 32, generator=gen)
        for g, e in zip(compiled(x, w, dtype), bit_cast(x, w, dtype)):
            torch.testing.assert_close(g, e, atol=1e-5, rtol=1e-5)
