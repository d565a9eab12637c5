"""fireclay_loops.backend's emission kit without any renderer: placement in scopes, the ops
handler's one method per op and per reduction kind, and that the kit imports no torch."""

import subprocess
import sys
from dataclasses import dataclass

import pytest

from fireclay_loops.backend import KernelOps, Scope, Value
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
