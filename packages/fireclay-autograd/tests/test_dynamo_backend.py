"""fireclay-autograd as a TorchDynamo backend (TorchDynamo is only the test's frontend here)."""

from __future__ import annotations

import copy

import torch
import torch.nn.functional as F

from fireclay_autograd import dynamo_backend


class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.a = torch.nn.Linear(8, 16)
        self.norm = torch.nn.LayerNorm(16)
        self.b = torch.nn.Linear(16, 4)

    def forward(self, x):
        return self.b(self.norm(F.gelu(self.a(x))))


def test_torch_compile_with_our_backend_trains_like_eager():
    torch.manual_seed(0)
    ours, eager = Net(), None
    eager = copy.deepcopy(ours)
    compiled = torch.compile(ours, backend=dynamo_backend())
    opt_ours = torch.optim.SGD(ours.parameters(), lr=0.1)
    opt_eager = torch.optim.SGD(eager.parameters(), lr=0.1)
    for _ in range(3):
        x, t = torch.randn(5, 8), torch.randint(0, 4, (5,))
        for model, opt in ((compiled, opt_ours), (eager, opt_eager)):
            opt.zero_grad()
            F.cross_entropy(model(x), t).backward()
            opt.step()
    for p, q in zip(ours.parameters(), eager.parameters()):
        torch.testing.assert_close(p, q, atol=1e-5, rtol=1e-5)
