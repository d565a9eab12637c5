"""Programs made by fireclay-ir's torch.fx interop (``from_fx``) go through the whole stage:
the path by which fireclay-autograd serves TorchDynamo-style fx graphs."""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.functional as F
from fx_programs import BatchNorm2d

from fireclay_autograd import compile_program
from fireclay_ir import from_fx


class Residual(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.a = torch.nn.Linear(6, 6)
        self.b = torch.nn.Linear(6, 6)

    def forward(self, x):
        return F.silu(self.b(torch.tanh(self.a(x)))) + x


MODULES = {
    "mlp": (lambda: torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.GELU(), torch.nn.LayerNorm(8),
                                        torch.nn.Linear(8, 2)), (5, 4)),
    "conv_bn": (lambda: torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3), BatchNorm2d(4), torch.nn.ReLU()), (2, 3, 6, 6)),
    "residual": (Residual, (3, 6)),
}


@pytest.mark.parametrize("name", sorted(MODULES))
def test_from_fx_programs_train_like_eager(name):
    torch.manual_seed(0)
    make, shape = MODULES[name]
    ours = make()
    eager = copy.deepcopy(ours)
    x = torch.randn(*shape)
    compiled = compile_program(from_fx(torch.fx.symbolic_trace(ours), [x]), [x])
    for _ in range(2):
        x = torch.randn(*shape)
        out, expected = compiled(x)[0], eager(x)
        torch.testing.assert_close(out, expected, atol=1e-5, rtol=1e-5)
        cot = torch.randn_like(out)
        out.backward(cot)
        expected.backward(cot)
    for p, q in zip(ours.parameters(), eager.parameters()):
        torch.testing.assert_close(p.grad, q.grad, atol=1e-5, rtol=1e-5)
    for (key, b), (_, c) in zip(ours.named_buffers(), eager.named_buffers()):
        if key.endswith("num_batches_tracked"):
            continue  # torch.fx runs this counter's add_ at trace time; it is not in the graph
        torch.testing.assert_close(b, c)
