"""fireclay_loops.backend's emission kit without any renderer: placement in scopes, the ops
handler's one method per op and per reduction kind, internal buffers, the target-independent
facts renderers share (column accesses, dtype extremes, 64-bit indices, the softmax pattern), and
that the kit imports no torch."""

import math
import struct
import subprocess
import sys
from dataclasses import dataclass

import pytest
import sympy

from fireclay_loops import Kernel
from fireclay_loops.backend import (
    KernelEmitter,
    KernelOps,
    Scope,
    StagePlan,
    Value,
    access,
    dtypes,
    patterns,
    wrapper_text,
)
from fireclay_loops.backend.reductions import REDUCTIONS
from fireclay_loops.ops import BINARY, REDUCTION_TYPES, UNARY


@dataclass(eq=False, kw_only=True)
class _V(Value):
    varying: bool = False

    def in_loop(self) -> bool:
        return self.varying or any(d.in_loop() for d in self.deps)


def test_a_value_is_placed_once_after_its_dependencies_and_invariants_go_before_the_loop():
    a = _V(name="a", code="a = load(x)")
    r = _V(name="r", code="r = load(y[r])", varying=True)
    s = _V(name="s", code="s = a + r", deps=[a, r])
    t = _V(name="t", code="t = s * a", deps=[s, a])
    outer = Scope()
    loop = Scope(parent=outer)
    loop.place(t)
    loop.place(s)
    assert outer.lines == ["a = load(x)"]
    assert loop.lines == ["r = load(y[r])", "s = a + r", "t = s * a"]
    later = Scope(parent=outer)  # a later loop recomputes what it needs of an earlier one
    later.place(s)
    assert later.lines == ["r = load(y[r])", "s = a + r"]


def test_a_stage_plan_places_its_statements_before_in_and_after_its_loop():
    x = _V(name="x", code="x = load(p)")
    r = _V(name="r", code="r = load(q + r0)", varying=True)
    update = _V(name="", code="acc += x * r", deps=[x, r], varying=True)
    store = _V(name="", code="out = acc", deps=[])
    plan = StagePlan(before=[x], in_loop=[update], after=[store])
    outer = Scope()
    loop = Scope(parent=outer)
    outer.place_all(plan.before)
    loop.place_all(plan.in_loop)
    outer.place_all(plan.after)
    assert outer.lines == ["x = load(p)", "out = acc"]
    assert loop.lines == ["r = load(q + r0)", "acc += x * r"]



@pytest.mark.parametrize("after", [True, False])
def test_statements_that_vary_go_in_the_loop_the_rest_after_a_reduction_or_before(after):
    r = Value(name="r", code="", varying=True)
    update, store = Value(name="", code="acc += r", deps=[r]), Value(name="", code="out = acc")
    plan = StagePlan()
    plan.add([update, store], after=after)
    assert plan.in_loop == [update]
    assert (plan.after, plan.before) == (([store], []) if after else ([], [store]))


def test_the_handler_has_a_method_per_op_and_per_reduction_kind_with_keywords():
    calls = []

    class Ops(KernelOps):
        def unary(self, name, a):
            return f"{name}({a})"

        def binary(self, name, a, b):
            return f"{name}({a}, {b})"

        def accumulate(self, kind, *, dtype, src_dtype, value):
            calls.append((kind, dtype, src_dtype, value))
            return kind

        def reduce_welford(self, *, dtype, src_dtype, value):
            return "own welford"

    ops = Ops(emitter=None)
    assert all(callable(getattr(ops, n)) for n in UNARY + BINARY)
    assert ops.exp("x") == "exp(x)" and ops.add("x", "y") == "add(x, y)"
    for kind in REDUCTION_TYPES:
        got = ops.reduction("float32", "float16", kind, "v")
        assert got == ("own welford" if kind == "welford" else kind)
    assert calls[0] == ("sum", "float32", "float16", "v") and len(calls) == len(REDUCTION_TYPES) - 1
    with pytest.raises(ValueError, match="unknown reduction kind 'median'"):
        ops.reduction("float32", "float32", "median", "v")


def test_the_kit_imports_no_torch():
    code = "import sys, fireclay_loops.backend; assert 'torch' not in sys.modules"
    subprocess.run([sys.executable, "-c", code], check=True)


def test_internal_buffers_stay_values_and_other_buffers_go_to_the_renderers_memory_ops():
    class Gen(KernelEmitter):
        error = LookupError

    class Ops(KernelOps):
        def load_memory(self, buf, index, mask):
            return Value(name=f"{buf}[{index}]" + ("" if mask is None else f" if {mask.name}"), code="")

        def masked(self, value, mask):
            return Value(name=f"{value.name} if {mask.name}", code="")

        def store_memory(self, buf, index, value):
            self.emitter.roots.append(Value(name="", code=f"{buf}[{index}] = {value.name}"))

    gen = Gen(Kernel("k", [], [sympy.Integer(4)], [], {"tmp"}))
    ops = Ops(gen)
    with pytest.raises(LookupError, match="tmp is read in k before the kernel computes it"):
        ops.load("tmp", 0)
    v, m = Value(name="v", code=""), Value(name="m", code="")
    ops.store("tmp", 0, v)
    assert ops.load("tmp", 0) is v and ops.masked_load("tmp", 0, m).name == "v if m"
    assert ops.load("a", "x0").name == "a[x0]" and ops.masked_load("b", 1, m).name == "b[1] if m"
    ops.store("out", "x0", v)
    assert [r.code for r in gen.roots] == ["out[x0] = v"]
    assert gen.buffers == {"a": False, "b": False, "out": True}  # the internal buffer is no argument


x0, x1, r0, s0 = sympy.symbols("x0 x1 r0 s0")


@pytest.mark.parametrize("accesses, columns", [
    ([r0 + 8 * x0], False),  # rows: contiguous along the reduction
    ([x0 + 8 * r0], True),  # columns: contiguous along the kept dim, strided along the reduced one
    ([x0 + 8 * r0, r0 + 8 * x0], False),  # one access along r: rows win
    ([r0, x0 + 8 * r0], True),  # a per-step value (x does not move it) does not count
    ([x0], False),  # no access moves with r
])
def test_which_reductions_read_columns(accesses, columns):
    assert access.reads_columns(accesses, [x0], [r0], hint=int) is columns


def test_index_steps():
    assert access.index_step(3 * x0 + r0, x0, int) == 3 and access.index_step(r0, x0, int) == 0
    assert access.index_step(sympy.Mod(x0, 4) + 4 * sympy.floor(x0 / 4), x0, int) == 1


@pytest.mark.parametrize("got, expected", [
    (dtypes.extreme("float32", largest=True), math.inf), (dtypes.extreme("int8", largest=False), -128),
    (dtypes.extreme("int64", largest=True), 2**63 - 1), (dtypes.extreme("uint8", largest=True), 255),
    (dtypes.extreme("bool", largest=False), 0), (REDUCTIONS["prod"].start_value("int32"), 1),
    (REDUCTIONS["max"].start_value("int16"), -32768), (REDUCTIONS["min"].start_value("bfloat16"), math.inf),
    (REDUCTIONS["argmax"].start_value("float32", part=1), -1), (REDUCTIONS["all"].start_value("bool"), 1),
    (dtypes.as_float32(0.1), struct.unpack("f", struct.pack("f", 0.1))[0]), (dtypes.as_float32(1e39), 1e39),
])
def test_dtype_facts(got, expected):
    assert got == expected


@pytest.mark.parametrize("size, constant", [
    (16, 16), (sympy.Integer(8), 8), ("12", 12), (sympy.Integer(3) * 4, 12), (s0, None), (2 * s0 + 1, None),
    ("s0", None),
])
def test_a_size_is_a_constant_of_the_program_or_known_at_run_time(size, constant):
    assert wrapper_text.constant_size(size) == constant


def test_64_bit_indices_for_symbolic_sizes_and_offsets_past_int32():
    small, symbolic = Kernel("k", [], [sympy.Integer(16)], []), Kernel("k", [], [s0], [])
    assert not dtypes.needs_index64(small, lambda b: sympy.Integer(16))
    assert dtypes.needs_index64(symbolic, lambda b: sympy.Integer(16))
    assert dtypes.needs_index64(Kernel("k", [], [sympy.Integer(2**31)], []), lambda b: sympy.Integer(16))


def test_values_vary_along_a_loop_through_what_they_read():
    r = Value(name="r", code="", varying=True)
    c = Value(name="c", code="")
    s = Value(name="s", code="", deps=[c, r])
    assert s.in_loop() and not c.in_loop()


def test_a_softmax_term_and_the_same_computation_in_two_loops():
    a, m = Value(name="a", code=""), Value(name="m", code="")
    m_cast = Value(name="m32", code="", op=("float_cast", m))
    term = Value(name="e", code="", op=("float_cast", Value(name="e0", code="", op=(
        "exp", Value(name="d", code="", op=("sub", a, m_cast))))))
    assert patterns.exp_of_difference(term) == (a, m)
    assert patterns.exp_of_difference(Value(name="x", code="", op=("exp", a))) is None

    def loop(first: str, second: str, factor: int) -> Value:
        load = Value(name=first, code=f"{first} = load(p + x0)")
        return Value(name=second, code=f"{second} = {first} * {factor}", deps=[load])

    memo: dict = {}
    assert patterns.canonical(loop("t1", "t2", 2), memo) == patterns.canonical(loop("t7", "t9", 2), memo)
    assert patterns.canonical(loop("t1", "t2", 2), memo) != patterns.canonical(loop("t7", "t9", 3), memo)


def test_a_flat_index_unflattens_row_major():
    gen = KernelEmitter(Kernel("k", [], [sympy.Integer(2), sympy.Integer(3), sympy.Integer(4)], []))
    assert gen.unflatten("x") == [("x0", 12, None), ("x1", 4, 3), ("x2", 1, 4)]


def test_every_reduction_kind_has_one_form():
    assert sorted(REDUCTIONS) == sorted(REDUCTION_TYPES)
    for form in REDUCTIONS.values():
        assert len(form.start) == len(form.parts) and (form.fold in BINARY or not form.fold)
        assert bool(form.fold) == (len(form.parts) == 1)


@pytest.mark.parametrize("kind, dtype", [
    ("sum", "float32"), ("sum", "int64"), ("prod", "float64"), ("prod", "int32"), ("max", "float32"),
    ("max", "int8"), ("min", "float64"), ("min", "int16"), ("any", "float32"), ("all", "int32"), ("all", "bool"),
])
def test_a_folded_form_reduces_as_eager_in_any_split(kind, dtype):
    """A form of one part, run as generated code runs it: lanes fold values from the start,
    then their partial states merge by the same op (a NaN included for max and min)."""
    torch = pytest.importorskip("torch")
    fold = {"add": torch.add, "mul": torch.mul, "maximum": torch.maximum, "minimum": torch.minimum,
            "logical_or": torch.logical_or, "logical_and": torch.logical_and}
    form = REDUCTIONS[kind]
    dt = getattr(torch, dtype)
    gen = torch.Generator().manual_seed(len(kind) * 31 + len(dtype))
    if dt.is_floating_point:
        x = torch.randn(7, 12, generator=gen, dtype=dt) / 2 + 1
        if form.selects:
            x[3, 5] = math.nan
    else:
        x = torch.randint(0, 3, (7, 12), generator=gen).to(dt)
    if form.truth:
        x = x != 0
    state_dtype = torch.bool if form.truth else dt
    for lanes in (1, 3, 4):
        parts = []
        for lane in range(lanes):
            state = torch.full((7,), form.start_value(dtype), dtype=state_dtype)
            for j in range(lane, 12, lanes):
                state = fold[form.fold](state, x[:, j]).to(state_dtype)
            parts.append(state)
        merged = parts[0]
        for p in parts[1:]:
            merged = fold[form.fold](merged, p).to(state_dtype)
        expected = {"sum": torch.sum, "prod": torch.prod, "any": torch.any, "all": torch.all,
                    "max": lambda t, dim: t.amax(dim), "min": lambda t, dim: t.amin(dim)}[kind](x, dim=1)
        assert torch.allclose(merged, expected.to(state_dtype), equal_nan=True), (kind, dtype, lanes)


@pytest.mark.parametrize("kind, itemsize, nbytes", [
    ("sum", 4, 4), ("prod", 8, 8), ("welford", 4, 12), ("welford", 8, 24), ("argmax", 4, 16),
    ("argmin", 1, 16), ("argmax", 8, 16), ("any", 4, 1), ("all", 8, 1),
])
def test_a_state_takes_the_bytes_of_its_struct(kind, itemsize, nbytes):
    assert REDUCTIONS[kind].state_bytes(itemsize) == nbytes
