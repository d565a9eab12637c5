"""Indexing a CUDA tensor with CPU index tensors, which eager accepts (it copies the indices to
the device itself): compiled graphs copy them explicitly, so generated kernels read one device's
memory. Forward and gradients against eager."""

from __future__ import annotations

import pytest
import torch

import fireclay

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")]


def rows_and_picks(x, picks):
    return x[torch.arange(x.shape[0]), picks] * 2


def cpu_rows(x, rows):
    return x[rows].sum(-1)


def unsafe_style(x, rows, cols):
    return x[rows, cols] + 1


CASES = [
    ("arange-cpu picks-cuda", rows_and_picks, lambda: (torch.randint(0, 7, (5,), device="cuda"),)),
    ("arange-cpu picks-cpu", rows_and_picks, lambda: (torch.randint(0, 7, (5,)),)),
    ("rows-cpu", cpu_rows, lambda: (torch.tensor([4, 0, 2, 2]),)),
    ("rows-cpu cols-cuda", unsafe_style, lambda: (torch.tensor([1, 3]), torch.tensor([6, 0], device="cuda"))),
    ("bool-mask-cpu", cpu_rows, lambda: (torch.tensor([True, False, True, True, False]),)),
]


@pytest.mark.parametrize("training", [False, True], ids=["infer", "train"])
@pytest.mark.parametrize("name,fn,make", CASES, ids=[c[0] for c in CASES])
def test_cpu_index_tensors_on_cuda_tensors_cuda(name, fn, make, training):
    x = torch.randn(5, 7, device="cuda", requires_grad=training)
    x_compiled = x.detach().clone().requires_grad_(training)
    indices = make()
    expected = fn(x, *indices)
    got = fireclay.compile(fn, fullgraph=not name.startswith("bool"))(x_compiled, *indices)
    torch.testing.assert_close(got, expected)
    if training:
        grad = torch.randn_like(expected)
        expected.backward(grad)
        got.backward(grad)
        torch.testing.assert_close(x_compiled.grad, x.grad)
