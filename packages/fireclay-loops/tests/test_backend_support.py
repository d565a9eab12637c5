"""The helpers both code generators share: wrapper text that evaluates to what it spells, size
binding, symbol ranges, and the run-time input/view/conform helpers against eager layouts."""

from __future__ import annotations

import math
import random

import pytest
import sympy

torch = pytest.importorskip("torch")

from fireclay_ir import Device, DType, Layout, MemoryFormat  # noqa: E402
from fireclay_loops import ExternNode, TensorArg  # noqa: E402
from fireclay_loops.backend import KernelEmitter, WrapperText, py_expr, py_shape  # noqa: E402
from fireclay_loops.backend.kernel import NONNEGATIVE, UNBOUNDED  # noqa: E402
from fireclay_loops.backend.runtime import CompiledCall, aten_op, conform, input_base, view  # noqa: E402


class _InputError(TypeError):
    pass


@pytest.mark.parametrize("value,want", [
    (3, 3), (-2.5, -2.5), (float("inf"), float("inf")), (float("-inf"), float("-inf")), (None, None),
    (float("nan"), float("nan")), (True, True), ("mean", "mean"), ([1, 2, 3], [1, 2, 3]), ((4,), (4,)), ((), ()), ([1.5, (2, 3)], [1.5, (2, 3)]),
    (DType("float16"), torch.float16), (Device("cpu"), torch.device("cpu")), (Layout("strided"), torch.strided),
    (MemoryFormat("channels_last"), torch.channels_last), (sympy.Symbol("s0") * 2 + 1, 7),
])
def test_literal_text_evaluates_to_the_value(value, want):
    w = WrapperText()
    got = eval(w.literal(value), {"torch": torch, "float": float, "s0": 3, **w.constants})
    if isinstance(want, float) and math.isnan(want):
        assert math.isnan(got)
    else:
        assert got == want and type(got) is type(want)
    assert not w.constants


def test_a_value_with_no_literal_becomes_a_namespace_constant():
    w = WrapperText()
    gen = torch.Generator()
    text = w.literal([gen, gen])
    assert eval(text, dict(w.constants)) == [gen, gen] and len(w.constants) == 2


@pytest.mark.parametrize("items", [[], [5], [2, 3], [sympy.Symbol("s1"), 4], [sympy.Symbol("s1") * 8, 1]])
def test_shape_text_is_a_tuple(items):
    got = eval(py_shape(items), {"s1": 6})
    assert isinstance(got, tuple) and got == tuple(int(sympy.sympify(x).subs("s1", 6)) for x in items)
    assert eval(py_expr(sum(items, sympy.Integer(0))), {"s1": 6}) == sum(got)


def test_extern_args_render_tensors_through_the_callback_and_the_rest_as_literals():
    w = WrapperText()
    t = TensorArg("buf0", [2, 3], [3, 1], 0)
    step = ExternNode("extern0", "aten::cat.default", [[t, t], 1], {"dtype": DType("float32")}, ["buf1"])
    args = w.extern_args(step, lambda a: f"T[{a.buffer!r}]")
    assert args == ["[T['buf0'], T['buf0']]", "1", "dtype=torch.float32"]
    w.call_extern(w.op(step.op), args, step)
    assert w.namespace_ops == {"op_aten_cat_default": "aten::cat.default"}
    ns = {"torch": torch, "T": {"buf0": torch.ones(2, 3)},
          "op_aten_cat_default": lambda ts, d, dtype: torch.cat(ts, d).to(dtype)}
    exec("def f():\n" + w.text + "    return results\n", ns)
    torch.testing.assert_close(ns["f"]()[0], torch.ones(2, 6))


class _Kernel:
    def __init__(self, xsizes, rsizes):
        self.xvars = [sympy.Symbol(f"x{i}") for i in range(len(xsizes))]
        self.rvars = [sympy.Symbol(f"r{i}") for i in range(len(rsizes))]
        self.xsizes = [sympy.sympify(s) for s in xsizes]
        self.rsizes = [sympy.sympify(s) for s in rsizes]


@pytest.mark.parametrize("name,want", [
    ("x0", (0, 9)), ("x1", NONNEGATIVE), ("r0", (0, 0)), ("s3", NONNEGATIVE), ("ind2", NONNEGATIVE),
    ("tmp", UNBOUNDED), ("gather", NONNEGATIVE),
])
def test_symbol_ranges(name, want):
    state = KernelEmitter(_Kernel([10, "s0"], [1]))
    state.indirect["gather"] = object()
    got = state.symbol_range(sympy.Symbol(name))
    assert ((got.lo, got.hi) == want) if isinstance(want, tuple) else (got == want)
    assert state.rnames == {"r0"} and state.fresh("v") == "v1" and state.fresh("v") == "v2"
    state.use_buffer("a", True)
    state.use_buffer("a", False)
    assert state.buffers == {"a": True}


def _layouts():
    """(input tensor, compiled size, stride, offset, storage numel) over contiguous, transposed,
    offset, expanded and zero-size inputs, each against contiguous and offset compiled layouts."""
    rng = random.Random(0)
    cases = []
    for size in [(3, 4), (1, 5), (0, 3), (2, 3, 4)]:
        contiguous = [1] * len(size)
        for d in range(len(size) - 2, -1, -1):
            contiguous[d] = contiguous[d + 1] * max(size[d + 1], 1)
        numel = math.prod(size)
        for offset in (0, 3):
            storage = offset + max(numel, 1)
            base = torch.randn(storage + 7)
            inputs = [base[offset:offset + numel].view(size) if numel else torch.empty(size),
                      torch.randn(tuple(reversed(size))).permute(*reversed(range(len(size)))),
                      base[rng.randrange(0, 5):][:numel].view(size) if numel else torch.empty(size)]
            if size[0] == 1:
                inputs.append(torch.randn(size[1:]).expand(size))
            for t in inputs:
                cases.append((t, size, tuple(contiguous), offset, storage))
    return cases


@pytest.mark.parametrize("t,size,stride,offset,storage", _layouts())
@pytest.mark.parametrize("device_type", [None, "cpu"])
def test_input_base_addresses_the_input_at_the_compiled_layout(t, size, stride, offset, storage, device_type):
    base = input_base(t, "x", t.dtype, size, stride, offset, storage, _InputError, device_type)
    got = view(base, size, stride, offset)
    torch.testing.assert_close(got, t)
    kept = all(n <= 1 or a == b for n, a, b in zip(size, t.stride(), stride)) and t.storage_offset() >= offset
    assert (got.data_ptr() == t.data_ptr()) == kept or 0 in size  # no copy unless the layout differs
    if offset == 0:  # the base itself is usable as the tensor
        torch.testing.assert_close(base.as_strided(size, stride, base.storage_offset()), t)


@pytest.mark.parametrize("t,message", [
    (3.0, "should be a tensor"), (torch.zeros(3, 4, dtype=torch.float64), "compile again"),
    (torch.zeros(3), "compile again"), (torch.zeros(4, 3), "has shape (4, 3)"),
])
def test_input_base_refuses_unlike_inputs(t, message):
    with pytest.raises(_InputError, match=message.replace("(", r"\(").replace(")", r"\)")):
        input_base(t, "x", torch.float32, (3, 4), (4, 1), 0, 12, _InputError, "cpu")


def test_input_base_names_the_device_only_when_it_checks_it():
    t = torch.zeros(3, 4, dtype=torch.float64)
    with pytest.raises(_InputError, match="on cpu; the program was compiled for torch.float32 .* on cpu"):
        input_base(t, "x", torch.float32, (3, 4), (4, 1), 0, 12, _InputError, "cpu")
    with pytest.raises(_InputError, match=r"\(3, 4\); the program was compiled for torch.float32 \(3, 4\):"):
        input_base(t, "x", torch.float32, (3, 4), (4, 1), 0, 12, _InputError)


@pytest.mark.parametrize("t,size,stride,copied", [
    (torch.randn(3, 4), (3, 4), (4, 1), False), (torch.randn(4, 3).t(), (3, 4), (4, 1), True),
    (torch.randn(1, 4), (1, 4), (99, 1), False), (torch.randn(3, 4), (3, 4), (1, 3), True),
])
def test_conform_copies_only_a_result_of_another_layout(t, size, stride, copied):
    got = conform(t, size, stride)
    torch.testing.assert_close(got, t)
    assert (got.data_ptr() != t.data_ptr()) == copied
    assert all(n <= 1 or a == b for n, a, b in zip(size, got.stride(), stride))


def test_aten_op_resolves_overloads_and_names_a_missing_one():
    x = torch.randn(5)
    torch.testing.assert_close(aten_op("aten::add.Tensor")(x, x), x + x)
    torch.testing.assert_close(aten_op("aten::relu")(x), torch.relu(x))
    with pytest.raises(_InputError, match="aten::no_such_op.default: torch .* has no such operator"):
        aten_op("aten::no_such_op.default", _InputError)


class _Scheduled:
    class program:
        inputs = ["a", "b"]
        input_specs: dict = {}  # user inputs only: no weights to bind
        weights: dict = {}

    def __str__(self) -> str:
        return "schedule"


def test_compiled_call_checks_the_input_count_and_dumps_its_sources(tmp_path):
    class Compiled(CompiledCall):
        input_error = _InputError

    c = Compiled(_Scheduled(), "def call(a, b): ...\n", lambda a, b: (a + b,))
    assert c(1, 2) == (3,)
    with pytest.raises(_InputError, match="takes 2 inputs, got 1"):
        c(1)
    paths = c.dump(str(tmp_path / "out"))
    assert [p.rsplit("/", 1)[1] for p in paths] == ["wrapper.py", "schedule.txt"]
    assert open(paths[1]).read() == "schedule\n"
