"""The public API: capture() forms, backends, fullgraph errors, eager fallback, program shape."""

from __future__ import annotations

import pytest
import torch
import torch.nn as nn

import fireclay_capture
from fireclay_capture import CaptureError, capture, register_backend


def test_decorator_forms():
    @capture
    def f(x):
        return x + 1

    @capture(fullgraph=True)
    def g(x):
        return x * 2

    x = torch.randn(3)
    torch.testing.assert_close(f(x), x + 1)
    torch.testing.assert_close(g(x), x * 2)
    assert f.__name__ == "f" and g.stats.captures == 1


def test_custom_backend_receives_program_and_example_inputs():
    seen = {}

    def backend(program, example_inputs):
        seen["program"] = program
        seen["inputs"] = example_inputs
        return lambda *args: [args[0] * 0 + 42]

    register_backend("answer", backend)
    cf = capture(lambda x: x.sin(), backend="answer")
    x = torch.randn(3)
    torch.testing.assert_close(cf(x), torch.full((3,), 42.0))
    assert seen["inputs"][0] is x
    assert seen["program"].main.nodes[0].op == "torch::Tensor.sin"


def test_unknown_backend_is_named():
    with pytest.raises(ValueError, match="unknown backend 'nope'"):
        capture(lambda x: x, backend="nope")


def data_dependent(x):
    y = x * 2
    if y.sum() > 0:
        return y
    return -y


def test_fullgraph_error_names_file_line_source_and_reason():
    cf = capture(data_dependent, fullgraph=True)
    with pytest.raises(CaptureError) as info:
        cf(torch.randn(4))
    message = str(info.value)
    assert "test_api.py:" in message
    assert "if y.sum() > 0:" in message
    assert "data-dependent" in message


def test_without_fullgraph_the_frame_breaks_at_the_branch():
    cf = capture(data_dependent)
    for _ in range(6):
        x = torch.randn(4)
        torch.testing.assert_close(cf(x), data_dependent(x))
    # One graph up to the branch; the two resume functions after it hold no op or one negation.
    assert (cf.stats.captures, cf.stats.fallbacks) == (1, 0)
    assert cf.break_count() == 1
    assert "data-dependent" in cf.cache.entries[0].graph_break.reason


def test_without_graph_breaks_the_frame_runs_eagerly(monkeypatch):
    from fireclay_capture import config

    monkeypatch.setattr(config, "graph_breaks", False)
    cf = capture(data_dependent)
    for _ in range(3):
        x = torch.randn(4)
        torch.testing.assert_close(cf(x), data_dependent(x))
    assert (cf.stats.captures, cf.stats.fallbacks) == (0, 1)
    assert "data-dependent" in cf.cache.entries[0].reason


def helper_that_prints(x):
    print("side effect")
    return x


def test_error_in_inlined_call_shows_the_call_chain():
    def outer(x):
        return helper_that_prints(x + 1)

    with pytest.raises(CaptureError) as info:
        capture(outer, fullgraph=True)(torch.randn(2))
    message = str(info.value)
    assert "print() inside the captured function" in message
    assert 'print("side effect")' in message
    assert "called from" in message and "helper_that_prints(x + 1)" in message


def test_is_compiling_answers_true_while_capturing():
    def f(x):
        if torch.compiler.is_compiling():
            return x + 1
        return x - 1

    x = torch.randn(3)
    torch.testing.assert_close(capture(f, fullgraph=True)(x), x + 1)
    assert not torch.compiler.is_compiling()


def test_nodes_carry_source_locations_and_call_stacks():
    def inner(t):
        return t.cos()

    def f(x):
        y = x.sin()
        return inner(y)

    cf = capture(f, fullgraph=True)
    cf(torch.randn(3))
    sin, cos = cf.last_program.main.nodes
    assert sin.meta["source"]["text"] == "y = x.sin()"
    assert sin.meta["source"]["file"].endswith("test_api.py")
    assert cos.meta["source"]["text"] == "return t.cos()"
    assert cos.meta["stack"][0]["text"] == "return inner(y)"


class Small(nn.Module):
    def __init__(self):
        super().__init__()
        self.block = nn.Sequential(nn.Linear(4, 4), nn.ReLU())
        self.register_buffer("offset", torch.ones(4))

    def forward(self, x):
        return self.block(x) + self.offset


def test_module_parameters_and_buffers_are_lifted_by_reference():
    m = Small().eval()
    cf = capture(m, fullgraph=True)
    x = torch.randn(2, 4)
    torch.testing.assert_close(cf(x), m(x))
    program = cf.last_program
    specs = {s.target: s.kind for s in program.main.input_specs if s.kind != "user"}
    assert specs == {"block.0.weight": "parameter", "block.0.bias": "parameter", "offset": "buffer"}
    assert program.weights["block.0.weight"].data is m.block[0].weight
    linear = program.main.find("torch::torch.nn.functional.linear")[0]
    assert linear.meta["module"] == "block.0"


def test_capture_bound_method_and_rejects_non_callables():
    m = Small().eval()
    cf = capture(m.forward, fullgraph=True)
    x = torch.randn(2, 4)
    torch.testing.assert_close(cf(x), m(x))
    with pytest.raises(TypeError, match="Python function or an nn.Module"):
        capture(42)


def test_keyword_and_default_arguments_bind_like_python():
    def f(x, y=None, *, scale=1.0):
        return x * scale if y is None else (x + y) * scale

    cf = capture(f, fullgraph=True)
    x, y = torch.randn(3), torch.randn(3)
    torch.testing.assert_close(cf(x), f(x))
    torch.testing.assert_close(cf(x, y, scale=2.0), f(x, y, scale=2.0))
    torch.testing.assert_close(cf(x=x, y=y), f(x=x, y=y))
    assert cf.stats.captures == 3


def test_module_with_hooks_runs_eagerly():
    m = Small().eval()
    calls = []
    m.register_forward_hook(lambda mod, inp, out: calls.append(1))
    cf = capture(m)
    x = torch.randn(2, 4)
    cf(x)
    assert cf.stats.fallbacks == 1


def test_program_is_valid_ir_and_prints():
    from fireclay_ir import format_program

    cf = capture(Small().eval(), fullgraph=True)
    cf(torch.randn(2, 4))
    text = format_program(cf.last_program)
    assert "torch.nn.functional.linear" in text and "block_0_weight" in text
    try:
        from fireclay_ir.verifier import verify
    except ImportError:  # pragma: no cover
        return
    verify(cf.last_program)


def test_no_grad_is_recorded_in_the_graph():
    w = torch.randn(3, requires_grad=True)

    def f(x):
        with torch.no_grad():
            y = x * w
        return y * w

    cf = capture(f, fullgraph=True)
    out = cf(torch.randn(3))
    assert out.requires_grad
    ops = [n.op for n in cf.last_program.main.nodes]
    assert ops.count("torch::torch.autograd.set_grad_enabled") == 2
    assert torch.is_grad_enabled()


def test_public_surface():
    assert set(fireclay_capture.__all__) >= {"capture", "CaptureError", "register_backend", "config"}


def test_captured_function_called_from_captured_code_is_inlined():
    inner = capture(lambda t: t.cos() * 2)

    def outer(x):
        return inner(x) + 1

    cf = capture(outer, fullgraph=True)
    x = torch.randn(3)
    torch.testing.assert_close(cf(x), x.cos() * 2 + 1)
    assert cf.stats.captures == 1 and inner.stats.calls == 0
    assert [n.op for n in cf.last_program.main.nodes] == [
        "torch::Tensor.cos", "torch::operator.mul", "torch::operator.add"]


def test_unsupported_keeps_the_frame_state_for_graph_breaks(monkeypatch):
    from fireclay_capture import config
    from fireclay_capture.api import CapturedFunction
    from fireclay_capture.errors import Unsupported

    def f(x):
        y = x + 1
        print(y)
        return y

    monkeypatch.setattr(config, "graph_breaks", False)
    cf = CapturedFunction(f, "eager", fullgraph=False, dynamic=None)
    seen = {}
    original = cf._fallback

    def spy(tx, e: Unsupported):
        seen["e"] = e
        return original(tx, e)

    cf._fallback = spy
    cf(torch.randn(2))
    frame = seen["e"].frame
    assert frame.code is f.__code__
    assert frame.inst.opname in ("CALL", "PRECALL") and "y" in frame.locals
    assert len(frame.tx.graph.nodes) == 1  # the add recorded before the break point


@pytest.mark.parametrize("pause", [True, False])
def test_garbage_collection_pauses_while_compiling_only(pause, monkeypatch):
    """The collector is off from capture through the first (compiling) call when
    config.pause_gc is set, and on again afterwards, also when the backend fails."""
    import gc

    monkeypatch.setattr(fireclay_capture.config, "pause_gc", pause)
    seen = []

    def backend(program, example_inputs):
        seen.append(("compile", gc.isenabled()))

        def run(*args):
            seen.append(("run", gc.isenabled()))
            return [args[0] + 1]

        return run

    def failing(program, example_inputs):
        raise RuntimeError("backend failure")

    assert gc.isenabled()
    cf = capture(lambda x: x * 2, backend=backend)
    x = torch.randn(3)
    torch.testing.assert_close(cf(x), x + 1)
    torch.testing.assert_close(cf(x), x + 1)  # a cache hit: nothing compiles
    assert seen == [("compile", not pause), ("run", not pause), ("run", True)]
    assert gc.isenabled()
    with pytest.raises(RuntimeError, match="backend failure"):
        capture(lambda x: x - 1, backend=failing)(x)
    assert gc.isenabled()


def test_equal_sources_hash_alike():
    from fireclay_capture.sources import AttrSource, ItemSource, LocalSource

    a = ItemSource(AttrSource(AttrSource(LocalSource("self"), "layers"), "_modules"), "3")
    b = ItemSource(AttrSource(AttrSource(LocalSource("self"), "layers"), "_modules"), "3")
    c = ItemSource(AttrSource(AttrSource(LocalSource("self"), "layers"), "_modules"), 3)
    assert a == b and hash(a) == hash(b) and len({a, b, c}) == 2
    assert a != c and hash(a) == hash(a)
