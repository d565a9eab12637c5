"""Through ``fireclay.compile`` (generated C++), a weight changed in a way the compiled code
depends on makes the next call compile again and agree with eager: fireclay-autograd no longer
checks each call's inputs itself (the capture's guards do), so the guards are the only check."""

from __future__ import annotations

import pytest
import torch
import torch.nn as nn

import fireclay


class Small(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(4, 4)
        self.gain = nn.Parameter(torch.rand(4) + 0.5)

    def forward(self, x):
        return torch.tanh(self.lin(x)) * self.gain


def _data(name, make):
    def change(m):
        p = m.gain if name == "gain" else getattr(m.lin, name)
        p.data = make(p.data)
    return change


def _replace(m):
    m.gain = nn.Parameter(torch.rand(4) + 3.0)


CHANGES = [
    ("replaced", _replace),
    ("dtype", _data("gain", lambda d: d.double())),
    ("shape", _data("gain", lambda d: d[:1].clone())),
    ("strides", _data("weight", lambda d: d.t().contiguous().t())),
    ("requires_grad", lambda m: m.gain.requires_grad_(False)),
]


@pytest.mark.parametrize("name,change", CHANGES, ids=[c[0] for c in CHANGES])
def test_weight_change_compiles_again(name, change):
    torch.manual_seed(0)
    m = Small()
    compiled = fireclay.compile(m)
    x = torch.randn(2, 4)
    torch.testing.assert_close(compiled(x), m(x))
    change(m)
    got, expected = compiled(x), m(x)
    assert got.dtype == expected.dtype and got.requires_grad == expected.requires_grad
    torch.testing.assert_close(got, expected)
    assert compiled._compiled.stats.captures == 2
    if expected.requires_grad:  # the training path's gradients reach the changed weights
        got.sum().backward()
        grads = [p.grad.clone() if p.grad is not None else None for p in m.parameters()]
        m.zero_grad(set_to_none=True)
        expected.sum().backward()
        for g, e in zip(grads, (p.grad for p in m.parameters())):
            assert (g is None) == (e is None)
            if e is not None:
                torch.testing.assert_close(g, e)
