"""Windows of a computed tensor (``Tensor.unfold``, PatchTST's patchify) returned beside values
computed after them: the windows are a view, so the memory they read must not be reused while
they are alive. Before, unfold was a library call returning a view into the program's reused
memory: PatchTST's ``patch_input`` came back overwritten, silently."""

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
