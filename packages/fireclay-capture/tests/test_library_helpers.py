"""What the library-helper cases of the corpus (corpus/library_helpers.py) leave outside the
graph: logging and warnings made after the graph as often as eagerly, deep copies guarded by the
original's state, modules with weights built in forward still split the graph, fake ids never
used as numbers."""

from __future__ import annotations

import copy
import dataclasses
import logging
import types
import warnings

import pytest
import torch

from fireclay_capture import capture, explain


def test_logging_is_replayed_after_the_graph_once_per_call(caplog):
    log = logging.getLogger("fireclay_test.library")

    def fn(x):
        log.warning("scaling by %d", 2)
        y = x * 2
        log.info("done")
        return y

    compiled = capture(fn, fullgraph=True)
    with caplog.at_level(logging.INFO, logger="fireclay_test.library"):
        for _ in range(3):
            x = torch.randn(3)
            torch.testing.assert_close(compiled(x), x * 2)
    messages = [r.getMessage() for r in caplog.records if r.name == "fireclay_test.library"]
    assert messages == ["scaling by 2", "done"] * 3
    assert compiled.stats.captures == 1


def test_warnings_are_replayed_once_per_call():
    def fn(x):
        warnings.warn("careful", UserWarning, stacklevel=1)
        return x + 1

    compiled = capture(fn, fullgraph=True)
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        for _ in range(2):
            compiled(torch.randn(2))
    assert [str(w.message) for w in seen] == ["careful", "careful"]
    # made after the graph, still at the user's line
    assert {(w.filename, w.lineno) for w in seen} == {(__file__, fn.__code__.co_firstlineno + 1)}


def test_a_message_built_from_tensor_data_still_breaks():
    log = logging.getLogger("fireclay_test.library")

    def fn(x):
        y = x * 2
        log.warning("value %s", y)
        return y + 1

    e = explain(fn)(torch.randn(3))
    assert (e.graph_count, e.break_count) == (2, 1)
    assert "not a constant of the trace" in e.break_reasons[0].reason


@dataclasses.dataclass
class _Config:
    scale: float = 2.0


def test_a_deep_copy_is_guarded_by_the_original_state():
    config = _Config()

    def fn(x):
        local = copy.deepcopy(config)
        local.scale = local.scale + 1
        return x * local.scale

    compiled = capture(fn, fullgraph=True)
    x = torch.randn(3)
    torch.testing.assert_close(compiled(x), x * 3.0)
    assert config.scale == 2.0  # the copy changed, not the original
    config.scale = 5.0
    torch.testing.assert_close(compiled(x), x * 6.0)
    assert compiled.stats.captures == 2


def test_a_copy_may_not_leave_the_function():
    config = _Config()

    def fn(x):
        return x + 1, copy.deepcopy(config)

    e = explain(fn)(torch.randn(3))
    # The copy is made for the trace alone: handing it out would share one object between calls.
    assert e.graph_count == 0 and "returning OwnedObjectVar(_Config)" in e.eager_frames[0]
    out = capture(fn)(torch.ones(3))
    assert out[1] == config and out[1] is not config


def test_a_module_with_weights_built_in_forward_is_not_captured():
    def fn(x):
        return torch.nn.Linear(4, 4)(x).shape[0] + x

    e = explain(fn)(torch.randn(4, 4))
    reasons = [b.reason for b in e.break_reasons] + e.eager_frames
    assert any("parameters or buffers" in r for r in reasons), reasons


@pytest.mark.parametrize("use", ["ordering", "arithmetic"])
def test_the_id_of_a_tensor_breaks_where_it_is_taken(use):
    def fn(x):
        y = x * 2
        marker = (id(y) > 0) if use == "ordering" else (id(y) % 2 + 1)
        return y * bool(marker)

    e = explain(fn)(torch.randn(3))
    assert (e.graph_count, e.break_count) == (2, 1)
    assert "id() of a tensor" in e.break_reasons[0].reason


def test_the_id_of_a_list_made_in_the_trace_is_never_used_as_a_number():
    def fn(x):
        a = []
        return x + id(a) % 2

    e = explain(fn)(torch.randn(3))
    assert e.graph_count == 0 and e.eager_frames  # the frame runs eagerly rather than guess


TYPE_CASTS = [
    ("dtype", lambda x: x.type(torch.float64) * 2),
    ("dtype keyword", lambda x: x.type(dtype=torch.int32) + 1),
    ("legacy name", lambda x: x.type("torch.HalfTensor") - 1),
    ("name as a constant", lambda x: (x + 1, x.type())),
    ("same dtype", lambda x: x.type(x.dtype) * 3),
]


@pytest.mark.parametrize("fn", [f for _, f in TYPE_CASTS], ids=[n for n, _ in TYPE_CASTS])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.int64])
def test_tensor_type_is_a_cast_in_one_graph(fn, dtype):
    """``Tensor.type`` is not an op of the torch dialect (given a string it imports by name): a
    cast to a dtype or legacy name is recorded as ``Tensor.to``, the name alone is a constant."""
    compiled = capture(fn, fullgraph=True)
    for _ in range(2):
        x = (torch.randn(2, 3) * 4).to(dtype)
        got, want = compiled(x), fn(x)
        for g, w in zip(got if isinstance(got, tuple) else (got,), want if isinstance(want, tuple) else (want,)):
            if isinstance(w, str):
                assert g == w
            else:
                assert g.dtype == w.dtype
                torch.testing.assert_close(g, w)
    assert compiled.stats.captures == 1


PYTHON_TYPE_DTYPES = [
    ("zeros int", lambda x: torch.zeros(x.shape[0], dtype=int) + x.sum().long()),  # Llama 4's chunked mask
    ("full float", lambda x: torch.full((2,), 0.5, dtype=float) * x[0, 0]),
    ("ones_like bool", lambda x: torch.ones_like(x, dtype=bool) & (x > 0)),
    ("to int", lambda x: (x * 4).to(int) + 1),
    ("ones complex", lambda x: torch.ones(3, dtype=complex) * x.sum()),
]


@pytest.mark.parametrize("fn", [f for _, f in PYTHON_TYPE_DTYPES], ids=[n for n, _ in PYTHON_TYPE_DTYPES])
def test_a_python_number_type_as_dtype_is_in_the_graph(fn):
    """torch reads ``int``, ``float``, ``bool`` and ``complex`` given for a dtype as int64, float64,
    bool and complex128."""
    compiled = capture(fn, fullgraph=True)
    for _ in range(2):
        x = torch.randn(3, 2)
        got, want = compiled(x), fn(x)
        assert got.dtype == want.dtype
        torch.testing.assert_close(got, want)
    assert compiled.stats.captures == 1


def test_a_denied_tensor_method_runs_eagerly_not_in_the_graph():
    def fn(x):
        y = x * 2
        y.share_memory_()
        return y + 1

    compiled = capture(fn)
    x = torch.randn(3)
    torch.testing.assert_close(compiled(x), fn(x))
    ops = [node.op for entry in compiled.cache.entries if entry.program is not None
           for graph in entry.program.graphs.values() for node in graph.nodes]
    assert ops and not any("share_memory_" in op for op in ops)


def test_a_legacy_name_on_another_device_is_not_a_plain_cast():
    compiled = capture(lambda x: x.type("torch.cuda.FloatTensor"))
    x = torch.randn(2, dtype=torch.float64)
    if torch.cuda.is_available():
        torch.testing.assert_close(compiled(x), x.type("torch.cuda.FloatTensor"))
    else:
        with pytest.raises((RuntimeError, AssertionError)):  # as eager: no CUDA here
            compiled(x)


class _ScaleShift(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, k):
        ctx.save_for_backward(x)
        ctx.k = k
        return x * k + 1

    @staticmethod
    def backward(ctx, grad):
        return grad * ctx.k * 2, None  # deliberately not the true derivative: eager's is the oracle


class _Gelu(torch.autograd.Function):
    @staticmethod
    def forward(x):
        return torch.nn.functional.gelu(x)

    @staticmethod
    def setup_context(ctx, inputs, output):
        ctx.save_for_backward(inputs[0])

    @staticmethod
    def backward(ctx, grad):
        return grad * 3


def _uses_functions(x):
    return _ScaleShift.apply(x, 3.0) + _Gelu.apply(x * 2)


@pytest.mark.parametrize("grad", ["no_grad", "no input requires grad", "requires grad"])
def test_autograd_function_forward_is_traced_when_no_gradient_is_asked(grad):
    """Bloom's GeLUFunction ran its whole frame eagerly: a Function applied where no backward can
    run is traced through its forward (ctx or setup_context style); with inputs that require
    grad the call runs eagerly, so the user's own backward (here deliberately unusual) is used."""
    compiled = capture(_uses_functions, fullgraph=grad != "requires grad")
    for _ in range(2):
        x = torch.randn(5, requires_grad=grad == "requires grad")
        if grad == "no_grad":
            with torch.no_grad():
                got, want = compiled(x), _uses_functions(x)
        else:
            got, want = compiled(x), _uses_functions(x)
        torch.testing.assert_close(got, want)
        assert got.requires_grad == want.requires_grad
        if grad == "requires grad":
            (gx,) = torch.autograd.grad(got.sum(), x)
            (wx,) = torch.autograd.grad(want.sum(), x)
            torch.testing.assert_close(gx, wx)
    if grad != "requires grad":
        assert compiled.stats.captures == 1


@pytest.mark.parametrize("value", [16, 2.5, True])
def test_numpy_ufuncs_on_python_numbers_are_constants(value):
    np = pytest.importorskip("numpy")

    def fn(x):
        return x * np.sqrt(value) + np.exp(1) - np.maximum(value, 3)

    compiled = capture(fn, fullgraph=True)
    x = torch.randn(4)
    torch.testing.assert_close(compiled(x), fn(x))


def _log_usage(obj):
    # torchvision.utils._log_api_usage_once, as its layers call it in forward
    module = obj.__module__
    name = obj.__class__.__name__
    if isinstance(obj, types.FunctionType):
        name = obj.__name__
    torch._C._log_api_usage_once(f"{module}.{name}")


def _depth_scaled(x, p):
    _log_usage(_depth_scaled)
    return x * (1 - p)


def _usage_of_a_nested_function(x):
    def inner(y):
        return y.sin()

    _log_usage(inner)
    return inner(x)


USAGE_LOGGING = [
    ("module-level function", lambda x: _depth_scaled(x, 0.25).cos()),
    ("nested function", _usage_of_a_nested_function),
    ("type name of a function", lambda x: x * len(_depth_scaled.__class__.__name__)),
]


@pytest.mark.parametrize("fn", [f for _, f in USAGE_LOGGING], ids=[n for n, _ in USAGE_LOGGING])
def test_usage_logging_of_library_layers_stays_in_one_graph(fn):
    compiled = capture(fn, fullgraph=True)
    for _ in range(2):
        x = torch.randn(3, 2)
        torch.testing.assert_close(compiled(x), fn(x))
    assert compiled.stats.captures == 1
