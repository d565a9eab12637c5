"""Programs with symbolic input sizes: one trace serves many sizes, guards send other sizes to
a new trace, a failing symbolic trace falls back to one compile per shape, and compiled
graphs get every symbol they use from their inputs."""

from __future__ import annotations

import logging

import pytest
import torch
from fx_programs import program_from
from helpers import clone_inputs, compare_with_eager
from symbolic import make_dynamic, resized

import fireclay_autograd.dynamic as dynamic
from fireclay_autograd import compile_program
from fireclay_autograd.executor import bind_symbols


class MLP(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1, self.fc2 = torch.nn.Linear(8, 16), torch.nn.Linear(16, 8)

    def forward(self, x):
        return self.fc2(torch.nn.functional.gelu(self.fc1(x))) + x


class Attention(torch.nn.Module):
    """A transformer block over (batch, seq, 16) written with views by sizes read off the input."""

    def __init__(self):
        super().__init__()
        self.qkv, self.out, self.norm = torch.nn.Linear(16, 48), torch.nn.Linear(16, 16), torch.nn.LayerNorm(16)

    def forward(self, x):
        b, s = x.shape[0], x.shape[1]
        q, k, v = self.qkv(self.norm(x)).split(16, dim=-1)
        heads = [t.view(b, s, 4, 4).transpose(1, 2) for t in (q, k, v)]
        a = torch.softmax(heads[0] @ heads[1].transpose(-1, -2) * 0.5, dim=-1) @ heads[2]
        return x + self.out(a.transpose(1, 2).reshape(b, s, 16))


def _module_program(model, x):
    program = program_from(model, [x.clone()])
    make_dynamic(program, [x])
    return program


@pytest.mark.parametrize("grad", [False, True], ids=["inference", "training"])
@pytest.mark.parametrize("model_cls,shape", [(MLP, (3, 5, 8)), (Attention, (2, 6, 16))], ids=["mlp", "attention"])
def test_one_trace_serves_many_sizes(model_cls, shape, grad):
    torch.manual_seed(0)
    model = model_cls()
    x = torch.randn(*shape)
    compiled = compile_program(_module_program(model, x), [x])
    for b, s in [(shape[0], shape[1]), (shape[0] + 2, shape[1] + 5), (shape[0] + 1, shape[1] + 11)]:
        compare_with_eager(model, compiled, [torch.randn(b, s, shape[2])], grad=grad, atol=1e-5, rtol=1e-4)
    assert compiled.dynamic.traces == 1
    assert compiled.dynamic.symbolic_failure is None


def test_aten_graphs_keep_symbolic_sizes():
    x = torch.randn(3, 5, 8, requires_grad=True)
    compiled = compile_program(_module_program(MLP(), x.detach()), [x])
    compiled(x)
    fw, bw = compiled.graphs.forward.main, compiled.graphs.backward.main
    assert fw.inputs[0].meta.shape == ("s0", "s1", "s2")
    assert any(isinstance(d, str) for v in fw.values() if v.is_tensor for d in v.meta.shape)
    assert any(isinstance(d, str) for v in bw.inputs if v.is_tensor for d in v.meta.shape)


def test_a_failed_guard_traces_again():
    # The mean divides by the element count, a size made a float: specialised with a guard.
    fn = lambda a: (a * a).mean()  # noqa: E731
    x = torch.randn(4, 6)
    program = program_from(fn, [x.clone()])
    make_dynamic(program, [x])
    compiled = compile_program(program, [x])
    with torch.no_grad():
        for size in [(4, 6), (5, 7), (4, 6), (5, 7)]:
            a = torch.randn(*size)
            torch.testing.assert_close(compiled(a)[0], fn(a))
    assert compiled.dynamic.traces == 2


def test_symbolic_failure_falls_back_to_one_compile_per_shape(monkeypatch, caplog):
    def refuse(program, inputs, *, mode=None, **kwargs):
        if mode is not None:
            raise RuntimeError("no symbolic trace today")
        return original(program, inputs, **kwargs)

    original = dynamic.trace_forward
    monkeypatch.setattr(dynamic, "trace_forward", refuse)
    model = MLP()
    x = torch.randn(3, 5, 8)
    compiled = compile_program(_module_program(model, x), [x])
    with caplog.at_level(logging.WARNING, logger="fireclay_autograd"):
        for size in [(3, 5), (4, 9), (3, 5)]:
            compare_with_eager(model, compiled, [torch.randn(*size, 8)], grad=False)
    assert "no symbolic trace today" in caplog.text and "once per input shape" in caplog.text
    assert compiled.dynamic.symbolic_failure is not None
    assert len(compiled.dynamic._static) == 2


def test_symbols_no_input_shows_reach_the_graph_through_carriers():
    # The backward of a full reduction gets only a scalar tangent, yet builds an (s0, s1) tensor.
    fn = lambda a: (a * 3).sum()  # noqa: E731
    x = torch.randn(4, 6, requires_grad=True)
    program = program_from(fn, [x.detach().clone().requires_grad_()])
    make_dynamic(program, [x])
    compiled = compile_program(program, [x])
    for size in [(4, 6), (7, 3)]:
        compare_with_eager(fn, compiled, [torch.randn(*size, requires_grad=True)])
    runtime = compiled.dynamic._entries["training"][0].runtime
    assert sorted(c.symbol for c in runtime.bw_carriers) == ["s0", "s1"]
    backward = compiled.graphs.backward.main
    assert bind_symbols(backward, [torch.empty(0)] * (len(backward.inputs) - 2)
                        + [torch.empty(7, dtype=torch.uint8), torch.empty(3, dtype=torch.uint8)]) == {"s0": 7, "s1": 3}


def test_inputs_that_do_not_fit_the_program_are_refused():
    x = torch.randn(3, 5, 8)
    compiled = compile_program(_module_program(MLP(), x), [x])
    with pytest.raises(TypeError, match="dims"):
        compiled(torch.randn(3, 8))


@pytest.mark.parametrize("name", ["ones_like_size", "arange_of_size", "view_by_size"])
def test_sizes_read_inside_the_program(name):
    fns = {
        "ones_like_size": lambda a: a + a.new_ones((a.shape[0], a.shape[1])),
        "arange_of_size": lambda a: a * a.new_ones(a.shape[1]).cumsum(0),
        "view_by_size": lambda a: a.reshape(a.shape[0] * a.shape[1]).cumsum(0).view(a.shape[0], a.shape[1]),
    }
    fn = fns[name]
    x = torch.randn(3, 5, requires_grad=True)
    program = program_from(fn, [x.detach().clone().requires_grad_()])
    sizes = make_dynamic(program, [x])
    compiled = compile_program(program, [x])
    for batch in ([x], [resized(x, {s: s + 4 for s in sizes})]):
        compare_with_eager(fn, compiled, clone_inputs(batch))
    assert compiled.dynamic.traces == 1


def test_inspection_functions_keep_symbolic_sizes():
    from fireclay_autograd import aot_graphs, trace_to_aten
    from fireclay_autograd.executor import run_program

    x = torch.randn(3, 5, 8, requires_grad=True)
    model = MLP()
    program = _module_program(model, x.detach())
    aten = trace_to_aten(program, [x.detach()])
    assert aten.main.inputs[0].meta.shape == ("s0", "s1", "s2") and set(aten.symbols) == {"s0", "s1", "s2"}
    # the one graph runs at another size, its symbols bound from the inputs
    y = torch.randn(6, 2, 8)
    weights = [aten.weights[spec.target].data for spec in aten.main.input_specs[1:]]
    with torch.no_grad():
        torch.testing.assert_close(run_program(aten, y, *weights)[0], model(y))
    graphs = aot_graphs(program, [x])
    assert graphs.forward.main.inputs[0].meta.shape == ("s0", "s1", "s2")
