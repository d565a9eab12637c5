"""Printed Python, C++ and Triton agree with sympy's value and with Python ints.

C++ is compiled once: one program evaluates a batch of random expressions on many value sets.
Triton text is evaluated as Python with C integer semantics for ``//`` and ``%`` (codeshim).
"""

import random
import shutil
import subprocess

import pytest
import sympy
from codeshim import c_div, c_mod, compile_triton
from exprgen import RANGES, concrete, random_tree, random_values, ranges_fn, sympy_value, to_sympy
from hypothesis import given, settings
from hypothesis import strategies as st

from fireclay_shapes import CPP_PRELUDE, FloorDiv, Max, Min, Mod, cpp_code, python_code, symbol, triton_code

NAMES = sorted(RANGES)
RANGES_FN = ranges_fn()


def python_value(expr, values):
    return eval(python_code(expr), {"__builtins__": {"max": max, "min": min}}, dict(values))


@pytest.mark.parametrize("a", range(-9, 10))
@pytest.mark.parametrize("b", [-4, -3, -1, 1, 2, 5])
def test_c_semantics_shim_is_c(a, b):
    assert c_div(a, b) == int(a / b)
    assert c_div(a, b) * b + c_mod(a, b) == a


@given(st.integers(0, 2**32), st.booleans())
@settings(max_examples=200, deadline=None)
def test_python_and_triton_forms_agree_with_concrete(seed, use_ranges):
    rng = random.Random(seed)
    tree = random_tree(rng)
    expr = to_sympy(tree)
    ranges = RANGES_FN if use_ranges else None
    triton = compile_triton(triton_code(expr, ranges=ranges), NAMES)
    for _ in range(5):
        values = random_values(rng)
        want = concrete(tree, values)
        assert sympy_value(expr, values) == want
        assert python_value(expr, values) == want
        assert triton(values) == want, triton_code(expr, ranges=ranges)


@pytest.mark.parametrize("expr,python,cpp,triton", [
    (FloorDiv(symbol("p0"), 4), "p0 // 4", "p0 / 4", "p0 // 4"),
    (Mod(symbol("n0"), 4), "n0 % 4", "fc_mod(n0, 4)",
     "tl.where((((n0) % (4)) != 0) & (((n0) % (4)) < 0), (n0) % (4) + (4), (n0) % (4))"),
    (Max(symbol("p0"), symbol("p1") + 1), "max(p0, p1 + 1)", "fc_max(p0, p1 + 1)", "tl.maximum(p0, p1 + 1)"),
    (Min(symbol("p0"), 3), "min(3, p0)", "fc_min(3, p0)", "tl.minimum(3, p0)"),
    (2 * symbol("p0") * symbol("p1") - 3, "2*p0*p1 - 3", "2*p0*p1 - 3", "2*p0*p1 - 3"),
    (symbol("p0") ** 3, "p0**3", "p0*p0*p0", "p0*p0*p0"),
    (sympy.Integer(2**40) * symbol("p0"), "1099511627776*p0", "1099511627776LL*p0", "1099511627776*p0"),
    (sympy.And(sympy.Lt(symbol("p0"), 4), sympy.Eq(symbol("p1"), 2)), "p1 == 2 and p0 < 4",
     "p1 == 2 && p0 < 4", "(p1 == 2) & (p0 < 4)"),
    (sympy.Not(sympy.Or(sympy.Eq(symbol("p0"), 1), sympy.Eq(symbol("p1"), 2))),
     "not (p0 == 1 or p1 == 2)", "!(p0 == 1 || p1 == 2)", "((p0 == 1) | (p1 == 2)) == 0"),
])
def test_printed_forms_golden(expr, python, cpp, triton):
    assert python_code(expr, ranges=RANGES_FN) == python
    assert cpp_code(expr, ranges=RANGES_FN) == cpp
    assert triton_code(expr, ranges=RANGES_FN) == triton


def test_names_map_symbols_to_source_text():
    expr = FloorDiv(symbol("s0") * 2 + symbol("s1"), 3)
    names = {"s0": "L['x'].size()[0]", "s1": "ks1"}
    assert python_code(expr, names) == "(ks1 + 2*L['x'].size()[0]) // 3"


CPP_BATCH_EXPRESSIONS = 300
CPP_VALUE_SETS = 25


@pytest.mark.skipif(shutil.which("g++") is None and shutil.which("c++") is None, reason="needs a C++ compiler")
def test_cpp_form_agrees_with_python_on_a_batch(tmp_path):
    rng = random.Random(1234)
    trees = [random_tree(rng) for _ in range(CPP_BATCH_EXPRESSIONS)]
    exprs = [to_sympy(t) for t in trees]
    value_sets = [random_values(rng) for _ in range(CPP_VALUE_SETS)]
    # Half the expressions are printed with ranges (plain operators where proven safe).
    bodies = [cpp_code(e, ranges=RANGES_FN if i % 2 else None) for i, e in enumerate(exprs)]
    decls = "".join(f"    int64_t {n}; std::cin >> {n};\n" for n in NAMES)
    lines = "".join(f"    std::cout << static_cast<int64_t>({b}) << '\\n';\n" for b in bodies)
    source = (CPP_PRELUDE + "#include <iostream>\nint main() {\n  int sets; std::cin >> sets;\n"
              "  for (int k = 0; k < sets; ++k) {\n" + decls + lines + "  }\n  return 0;\n}\n")
    (tmp_path / "eval.cpp").write_text(source)
    compiler = shutil.which("g++") or shutil.which("c++")
    subprocess.run([compiler, "-O0", "-std=c++17", "-o", str(tmp_path / "eval"), str(tmp_path / "eval.cpp")],
                   check=True, capture_output=True)
    stdin = f"{len(value_sets)}\n" + "\n".join(" ".join(str(vs[n]) for n in NAMES) for vs in value_sets)
    out = subprocess.run([str(tmp_path / "eval")], input=stdin, capture_output=True, text=True, check=True)
    got = [int(x) for x in out.stdout.split()]
    want = [concrete(t, vs) for vs in value_sets for t in trees]
    assert len(got) == len(want)
    mismatches = [(dumps_pair(exprs[i % len(trees)], bodies[i % len(trees)]), g, w)
                  for i, (g, w) in enumerate(zip(got, want)) if g != w]
    assert not mismatches, mismatches[:5]


def dumps_pair(expr, body):
    return f"{expr}  ->  {body}"
