"""``compile_program(..., inputs_checked=True)``: a caller that checks every input before each
call (the capture's guards) gets calls without the program's own input check, with eager's
results and gradients, weights, input mutations and aliased outputs included."""

from __future__ import annotations

import pytest
import torch
import torch.nn as nn
from fx_programs import program_from
from helpers import clone_inputs, compare_with_eager

from fireclay_autograd import compile_program
from fireclay_autograd.api import CompiledProgram


class Weighted(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(4, 3)

    def forward(self, x):
        return self.lin(x).relu()


def _mutates(x, y):
    x.add_(1)
    return x * y


def _aliases(x, y):
    return x.view(-1), (x + y).t()


def _frozen_weights():
    m = Weighted()
    for p in m.parameters():
        p.requires_grad_(False)
    return m


CASES = [
    ("weights", Weighted, lambda: [torch.randn(2, 4)]),
    ("weights, input requires grad", Weighted, lambda: [torch.randn(2, 4, requires_grad=True)]),
    ("frozen weights", _frozen_weights, lambda: [torch.randn(2, 4)]),
    ("input mutation", lambda: _mutates, lambda: [torch.randn(3), torch.randn(3)]),
    ("aliased outputs", lambda: _aliases, lambda: [torch.randn(2, 3, requires_grad=True), torch.randn(2, 3)]),
]


@pytest.mark.parametrize("grad", [False, True], ids=["no_grad", "grad"])
@pytest.mark.parametrize("name,make_fn,make_inputs", CASES, ids=[c[0] for c in CASES])
def test_checked_inputs_match_eager(name, make_fn, make_inputs, grad, monkeypatch):
    torch.manual_seed(0)
    fn, inputs = make_fn(), make_inputs()
    compiled = compile_program(program_from(fn, clone_inputs(inputs)), clone_inputs(inputs), inputs_checked=True)

    def not_called(self, user_inputs):
        raise AssertionError("the inputs were checked again")

    monkeypatch.setattr(CompiledProgram, "_full_inputs", not_called)
    for _ in range(2):  # the first call traces, the second runs what was traced
        compare_with_eager(fn, compiled, inputs, grad=grad)
