"""Maximum and minimum with the NaN test on the second operand (the prelude's
``fc_maximum_test_b``): a clamp's constant bounds (relu6, hardswish, hardsigmoid, clamp) and the
folds of max/min reductions use it. Results against eager over a table of ops and shapes, with
NaN, infinities and signed zeros among the inputs; the generated code takes that form only where
it should; and with a constant bound the compiler is left no NaN test to make."""

from __future__ import annotations

import platform
import re
import shutil
import subprocess

import pytest
import torch
from aten_builder import AtenBuilder

import fireclay_cpp
from fireclay_cpp.prelude import PRELUDE

SPECIALS = [float("nan"), float("inf"), float("-inf"), 0.0, -0.0, -3.0, 3.0, 6.0, -6.0, 1e-30]


def _with_specials(shape, dtype, seed):
    gen = torch.Generator().manual_seed(seed)
    x = (torch.randn(shape, generator=gen, dtype=torch.float64) * 4).to(dtype)
    flat = x.view(-1)
    picks = torch.randperm(flat.numel(), generator=gen)[: 2 * len(SPECIALS)]
    for k, at in enumerate(picks.tolist()):
        flat[at] = SPECIALS[k % len(SPECIALS)]
    return x


# name -> (aten op, extra arguments): each a max or min with a constant, or a reduction of them
POINTWISE = {
    "relu6": ("hardtanh.default", (0.0, 6.0)),
    "hardtanh": ("hardtanh.default", (-1.5, 2.5)),
    "hardswish": ("hardswish.default", ()),
    "hardsigmoid": ("hardsigmoid.default", ()),
    "clamp": ("clamp.default", (-0.5, 0.75)),
    "clamp_min": ("clamp_min.default", (0.25,)),
    "clamp_max": ("clamp_max.default", (-0.25,)),
    "clamp_nan_bound": ("clamp.default", (float("nan"), None)),
}
REDUCTIONS = {
    "amax_rows": ("amax.default", ([-1],)),
    "amin_rows": ("amin.default", ([-1],)),
    "amax_columns": ("amax.default", ([0],)),
    "softmax": ("_softmax.default", (-1, False)),
}
SHAPES = [(7, 33), (3, 4, 17), (2, 1000)]


def _compile(op, args, x):
    b = AtenBuilder()
    xi = b.input(x, "x")
    program = b.output(b.call(op, xi, *args))
    return b, fireclay_cpp.compile_program(program, [x])


def _assert_same(got, want):
    assert torch.equal(got.isnan(), want.isnan())
    ok = ~want.isnan()
    torch.testing.assert_close(got[ok], want[ok], atol=1e-6, rtol=1e-6)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=str)
@pytest.mark.parametrize("shape", SHAPES, ids=str)
@pytest.mark.parametrize("name", sorted(POINTWISE))
def test_max_and_min_with_constant_bounds_match_eager(name, shape, dtype):
    op, args = POINTWISE[name]
    b, compiled = _compile(op, args, torch.empty(shape, dtype=dtype))
    for seed in range(2):
        x = _with_specials(shape, dtype, seed)
        (got,), (want,) = compiled(x), b.eager(x)
        _assert_same(got, want)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=str)
@pytest.mark.parametrize("shape", SHAPES, ids=str)
@pytest.mark.parametrize("name", sorted(REDUCTIONS))
def test_max_and_min_reductions_match_eager(name, shape, dtype):
    op, args = REDUCTIONS[name]
    b, compiled = _compile(op, args, torch.empty(shape, dtype=dtype))
    for seed in range(2):
        x = _with_specials(shape, dtype, seed)
        if seed == 1:
            x = x.nan_to_num(0.0)  # rows without NaN too (a NaN decides a whole row)
        (got,), (want,) = compiled(x), b.eager(x)
        _assert_same(got, want)


def _kernel_source(compiled) -> str:
    """The kernels' code, without the prelude's."""
    return "\n".join(src.split('extern "C" void kernel', 1)[1] for src in compiled.cpp_sources)


@pytest.mark.parametrize("name", ["relu6", "hardswish", "clamp", "clamp_min", "clamp_max"])
def test_constant_bounds_take_the_form_that_tests_the_other_side(name):
    op, args = POINTWISE[name]
    _, compiled = _compile(op, args, torch.empty(4, 8))
    code = _kernel_source(compiled)
    assert re.search(r"fc_(maximum|minimum)_test_b<float>", code)
    assert not re.search(r"fc_(maximum|minimum)<float>", code)


def test_two_computed_values_keep_the_general_form():
    """torch.maximum of two tensors: the general form (a max pool's chain of them over ReLU
    outputs, in scalar loops, branches on the other one)."""
    b = AtenBuilder()
    x, y = b.input(torch.empty(4, 8), "x"), b.input(torch.empty(4, 8), "y")
    compiled = fireclay_cpp.compile_program(b.output(b.call("maximum.default", x, y)))
    code = _kernel_source(compiled)
    assert "fc_maximum<float>" in code and "fc_maximum_test_b" not in code
    gen = torch.Generator().manual_seed(3)
    xs = [torch.randn(4, 8, generator=gen) for _ in range(2)]
    xs[0][0, 0], xs[1][1, 1] = float("nan"), float("nan")
    _assert_same(compiled(*xs)[0], torch.maximum(*xs))


def test_nan_bound_keeps_the_general_form():
    op, args = POINTWISE["clamp_nan_bound"]
    _, compiled = _compile(op, args, torch.empty(4, 8))
    assert "_test_b<float>" not in _kernel_source(compiled)


def test_reductions_add_with_the_test_on_the_new_value_and_merge_with_the_general_form():
    """add() runs in the vectorised loop, merge() in the short scalar chain of partials."""
    for kind, op in (("max", "maximum"), ("min", "minimum")):
        struct = PRELUDE.split(f"struct fc_{kind}_acc {{", 1)[1].split("};", 1)[0]
        assert f"add(T x, int64_t) {{ v = fc_{op}_test_b(v, x); }}" in struct
        assert f"merge(const fc_{kind}_acc& o) {{ v = fc_{op}(v, o.v); }}" in struct


# a NaN test: a register compared with itself, or an (un)ordered compare
_SELF_COMPARE = re.compile(r"\b(v?ucomis[sd]|v?comis[sd])\s+(%xmm\d+),\s*\2\b|cmp(un)?ord")


@pytest.mark.skipif(platform.machine() not in ("x86_64", "AMD64"), reason="reads x86-64 assembly")
def test_a_constant_bound_leaves_no_nan_test():
    """Compiled with the backend's compiler and flags, a clamp of a float to constant bounds makes
    no NaN test (no comparison of a register with itself) with the b-testing form, where the
    general form keeps one per op."""
    cfg = fireclay_cpp.config
    compiler = cfg.resolved_compiler()
    if shutil.which(compiler) is None:
        pytest.skip(f"no {compiler}")
    source = PRELUDE + """
extern "C" float clamp_test_b(float a) { return fc_minimum_test_b(fc_maximum_test_b(a, 0.0f), 6.0f); }
extern "C" float clamp_general(float a) { return fc_minimum(fc_maximum(a, 0.0f), 6.0f); }
"""
    flags = [f for f in cfg.flags() if f not in ("-shared", "-fPIC")]
    done = subprocess.run([compiler, *flags, "-x", "c++", "-S", "-o", "-", "-"], input=source, text=True,
                          capture_output=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]

    def body(name: str) -> str:
        return done.stdout.split(f"\n{name}:", 1)[1].split("\t.cfi_endproc", 1)[0]

    assert not _SELF_COMPARE.search(body("clamp_test_b"))
    assert _SELF_COMPARE.search(body("clamp_general"))
