"""fireclay-autograd as a TorchDynamo backend (TorchDynamo is only the test's frontend here)."""

from __future__ import annotations

import copy

import pytest
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


def _scaled(x, n):
    return (x * n).relu() + n


def _flattened(x):
    return torch.tanh(x.view(x.size(0) * 2, -1)).sum(0) * x.shape[0]


def _paired(x, y):
    return x.sum(1) + y.amax(1)


# With a size that changes, TorchDynamo captures again with dynamic shapes and hands the size
# symbols (and changed ints) over as int inputs.
SIZE_CASES = [
    ("module", lambda n: (torch.randn(n, 8),), (3, 5, 8)),
    ("flattened", lambda n: (torch.randn(n, 6),), (3, 5, 8)),
    ("scaled", lambda n: (torch.randn(3, 4), n), (3, 5, -2, 8)),
    ("paired", lambda n: (torch.randn(n, 3), torch.randn(n, n + 2)), (3, 5, 8)),
]


@pytest.mark.parametrize("name, inputs, sizes", SIZE_CASES, ids=[c[0] for c in SIZE_CASES])
def test_torch_compile_with_changing_sizes_trains_like_eager(name, inputs, sizes):
    torch.manual_seed(0)
    torch._dynamo.reset()  # baseline-ok: TorchDynamo is this test's front end
    fn = {"module": Net(), "flattened": _flattened, "scaled": _scaled, "paired": _paired}[name]
    compiled = torch.compile(fn, backend=dynamo_backend())
    params = list(fn.parameters()) if isinstance(fn, torch.nn.Module) else []
    for n in sizes:
        args = tuple(x.requires_grad_() if isinstance(x, torch.Tensor) else x for x in inputs(n))
        out, expected = compiled(*args), fn(*args)
        torch.testing.assert_close(out, expected)
        leaves = [x for x in args if isinstance(x, torch.Tensor)] + params
        for got, want in zip(torch.autograd.grad(out.sum(), leaves), torch.autograd.grad(expected.sum(), leaves)):
            torch.testing.assert_close(got, want)


@pytest.mark.parametrize("examples, actions, carried_len", [
    # the symbol of the int is a dim of x: dropped
    ("bound", {0: "dropped"}, None),
    # an int no tensor's size holds: a uint8[n] carrier in its place
    ("free", {1: "carried"}, 5),
])
def test_int_inputs_become_sizes(examples, actions, carried_len):
    from fireclay_autograd.int_inputs import tensor_inputs_only
    from fireclay_ir import Graph, Program, ScalarType, SymExpr, TensorMeta

    graph = Graph("main")
    if examples == "bound":
        s = graph.add_input("s9", ScalarType("int"))
        x = graph.add_input("x", TensorMeta("float32", ("s9", 4)))
        args = [5, torch.randn(5, 4)]
    else:
        x = graph.add_input("x", TensorMeta("float32", (3, 4)))
        s = graph.add_input("n", ScalarType("int"))
        args = [torch.randn(3, 4), 5]
    y = graph.call("torch::operator.mul", (x, s), out=TensorMeta("float32", x.meta.shape))
    graph.set_outputs([y])
    program = Program.single(graph)
    ints = tensor_inputs_only(program, args)
    assert ints.actions == actions
    assert all(v.is_tensor for v in program.main.inputs)
    [node] = program.main.nodes
    assert isinstance(node.args[1], SymExpr)
    new_args = ints.arguments(args)
    assert len(new_args) == len(program.main.inputs)
    if carried_len is not None:
        carrier = new_args[list(actions)[0]]
        assert carrier.dtype == torch.uint8 and carrier.shape == (carried_len,)
        assert ints.arguments([torch.randn(3, 4), -1]) is None
