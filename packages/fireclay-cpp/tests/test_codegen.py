"""Kernels beyond the op table's small shapes: symbolic sizes, OpenMP-parallel loops, reductions
split over threads (per-thread partials, Welford merges, argmax ties), half precision, integer
and boolean dtypes. Every result is checked against eager on fresh random inputs."""

from __future__ import annotations

import pytest
import torch
from aten_builder import AtenBuilder
from batch import SEED

import fireclay_cpp
from fireclay_ir import Graph, Program, TensorMeta

GEN = torch.Generator().manual_seed(SEED)


def _randn(*shape, dtype=torch.float32):
    return torch.randn(shape, generator=GEN, dtype=torch.float64).to(dtype)


def _symbolic_softmax() -> Program:
    g = Graph("main")
    x = g.add_input("x", TensorMeta("float32", ("s0", "s1")))
    m = g.call("aten::amax.default", (x, [1], True), out=TensorMeta("float32", ("s0", 1)))
    s = g.call("aten::sub.Tensor", (x, m), out=TensorMeta("float32", ("s0", "s1")))
    e = g.call("aten::exp.default", (s,), out=TensorMeta("float32", ("s0", "s1")))
    z = g.call("aten::sum.dim_IntList", (e, [1], True), out=TensorMeta("float32", ("s0", 1)))
    o = g.call("aten::div.Tensor", (e, z), out=TensorMeta("float32", ("s0", "s1")))
    g.set_outputs([o])
    p = Program.single(g)
    p.add_symbol("s0", hint=64, min=2)
    p.add_symbol("s1", hint=32, min=2)
    return p


def test_symbolic_sizes_are_kernel_arguments():
    compiled = fireclay_cpp.compile_program(_symbolic_softmax())
    src = compiled.cpp_sources[0]
    assert "const int64_t s0" in src and "const int64_t s1" in src
    for rows, cols in [(3, 5), (64, 32), (513, 257), (2, 1000)]:
        x = _randn(rows, cols)
        (got,) = compiled(x)
        torch.testing.assert_close(got, torch.softmax(x, 1), atol=1e-6, rtol=1e-5)


def _one_op(op, tensors, *args, **kwargs):
    b = AtenBuilder()
    handles = [b.input(t, f"x{i}") for i, t in enumerate(tensors)]
    out = b.call(op, *handles, *args, **kwargs)
    outs = out if isinstance(out, tuple) else (out,)
    return b.output(*outs), b


BIG = [
    # (id, op, inputs, args, kwargs, atol, rtol)
    ("sum_all_split", "sum.default", [(1 << 18,)], (), {}, 1e-2, 1e-4),
    ("mean_rows_parallel", "mean.dim", [(1024, 300)], ([1],), {}, 1e-5, 1e-5),
    ("var_all_split_welford", "var.correction", [(3, 50000)], (), {"correction": 1}, 1e-4, 1e-4),
    ("var_rows", "var.correction", [(700, 129)], ([1],), {"correction": 0}, 1e-5, 1e-4),
    ("amax_all_split", "amax.default", [(200, 1000)], ([0, 1],), {}, 0, 0),
    ("softmax_rows", "_softmax.default", [(257, 1031)], (1, False), {}, 1e-6, 1e-5),
    ("layer_norm", "native_layer_norm.default", [(512, 384), (384,), (384,)], ([384], 1e-5), {}, 1e-4, 1e-4),
    ("pointwise_parallel_transposed", "add.Tensor", [(300, 400), "T(400, 300)"], (), {}, 0, 0),
    ("gelu_parallel", "gelu.default", [(1 << 17,)], (), {}, 1e-6, 1e-5),
    ("sum_cols", "sum.dim_IntList", [(2000, 37)], ([0],), {}, 1e-3, 1e-4),
]


def _make(spec, dtype):
    if isinstance(spec, str):  # "T(a, b)": a transposed (non-contiguous) input
        a, b = (int(v) for v in spec[2:-1].split(","))
        return _randn(a, b, dtype=dtype).t()
    return _randn(*spec, dtype=dtype)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16], ids=str)
def test_large_kernels_match_eager(dtype):
    # All cases in one program per dtype: one compile.
    b = AtenBuilder()
    tensors, outs, tol = [], [], []
    for cid, op, inputs, args, kwargs, atol, rtol in BIG:
        ts = [_make(s, dtype) for s in inputs]
        hs = []
        for t in ts:
            tensors.append(t)
            hs.append(b.input(t, f"x{len(tensors)}"))
        if op == "native_layer_norm.default":
            out = b.call(op, hs[0], args[0], hs[1], hs[2], args[1])
        else:
            out = b.call(op, *hs, *args, **kwargs)
        out = out if isinstance(out, tuple) else (out,)
        outs.extend(out[:1])
        if dtype == torch.bfloat16:
            atol, rtol = max(atol, 5e-2), max(rtol, 2e-2)
        tol.append((cid, atol, rtol))
    program = b.output(*outs)
    compiled = fireclay_cpp.compile_program(program)
    assert "#pragma omp parallel" in compiled.cpp_sources[0]
    assert "_parts[omp_get_thread_num()]" in compiled.cpp_sources[0]  # a reduction split over threads
    got = compiled(*tensors)
    if dtype == torch.bfloat16:
        # Eager's own bfloat16 reductions round differently from ours (both accumulate in float32,
        # in different orders, then round to bfloat16): the oracle is float64 on the same inputs.
        want = b.eager(*(t.double() for t in tensors))
        got = [g.double() for g in got]
    else:
        want = b.eager(*tensors)
    for (cid, atol, rtol), g, w in zip(tol, got, want):
        torch.testing.assert_close(g, w, atol=atol, rtol=rtol, msg=lambda m, cid=cid: f"{cid} (seed {SEED}): {m}")


def test_argmax_ties_keep_the_first_index_across_threads():
    # Few distinct values: many ties, spread over the per-thread chunks of a split reduction.
    x = torch.randint(0, 4, (1 << 16,), generator=GEN).to(torch.float32)
    y = torch.randint(0, 3, (5, 9000), generator=GEN)
    program, b = _one_op("argmax.default", [x])
    (got,) = fireclay_cpp.compile_program(program)(x)
    assert got.item() == torch.argmax(x).item()
    program, b = _one_op("argmin.default", [y], 1)
    (got,) = fireclay_cpp.compile_program(program)(y)
    torch.testing.assert_close(got, torch.argmin(y, 1))


def test_max_propagates_nan():
    x = _randn(4, 5000)
    x[1, 4321] = float("nan")
    program, _ = _one_op("amax.default", [x], [1])
    (got,) = fireclay_cpp.compile_program(program)(x)
    torch.testing.assert_close(got, torch.amax(x, 1), equal_nan=True)


@pytest.mark.parametrize("op,low,high", [("floor_divide.default", -50, 50), ("remainder.Tensor", -50, 50),
                                         ("fmod.Tensor", -50, 50)])
def test_integer_division_has_python_semantics_for_negatives(op, low, high):
    a = torch.randint(low, high, (64, 65), generator=GEN)
    d = torch.randint(1, 9, (64, 65), generator=GEN) * (torch.randint(0, 2, (64, 65), generator=GEN) * 2 - 1)
    program, b = _one_op(op, [a, d])
    (got,) = fireclay_cpp.compile_program(program)(a, d)
    torch.testing.assert_close(got, b.eager(a, d)[0])


@pytest.mark.parametrize("op,dtype", [("sum.dim_IntList", torch.int64), ("sum.dim_IntList", torch.bool),
                                      ("any.dim", torch.bool), ("all.dim", torch.int64),
                                      ("amax.default", torch.int64)])
def test_integer_and_bool_reductions(op, dtype):
    x = torch.randint(-1000, 1000, (37, 3000), generator=GEN)
    x = (x > 0) if dtype == torch.bool else x
    args = ([1],) if op in ("sum.dim_IntList", "amax.default") else (1,)
    program, b = _one_op(op, [x], *args)
    (got,) = fireclay_cpp.compile_program(program)(x)
    torch.testing.assert_close(got, b.eager(x)[0])


def test_float16_computes_in_float32_and_rounds_on_store():
    x, y = _randn(300, 70, dtype=torch.float16), _randn(300, 70, dtype=torch.float16)
    program, b = _one_op("mul.Tensor", [x, y])
    (got,) = fireclay_cpp.compile_program(program)(x, y)
    torch.testing.assert_close(got, x * y, atol=0, rtol=0)  # one rounding: exact


def test_strided_input_with_offset_is_indexed_in_place():
    base = _randn(10, 12)
    x = base[2:8, 1:11:3]  # storage offset and strides unlike a fresh tensor
    program, b = _one_op("mul.Tensor", [x, x])
    compiled = fireclay_cpp.compile_program(program)
    (got,) = compiled(x, x)
    torch.testing.assert_close(got, x * x)
    fresh = _randn(6, 4)  # a contiguous input of the same shape: copied into the compiled layout
    (got,) = compiled(fresh, fresh)
    torch.testing.assert_close(got, fresh * fresh)


@pytest.mark.parametrize("op", ["rand_like.default", "randn_like.default"])
def test_random_numbers_are_the_reference_philox_stream(op):
    # Eager's generator is not ours: compare with fireclay-loops' reference executor (the same
    # Philox4x32-10 stream), and check the distribution against eager's.
    from fireclay_loops import lower, schedule
    from fireclay_loops.reference import run

    x = _randn(60, 50)
    program, _ = _one_op(op, [x])
    scheduled = schedule(lower(program))
    (got,) = fireclay_cpp.compile_program(scheduled)(x)
    (want,) = run(scheduled, x)
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
    # The distribution eager draws from: uniform [0, 1) or standard normal. Six standard errors
    # of the sample mean and deviation: a wrong distribution fails, sampling noise does not.
    mean, std = (0.5, (1 / 12) ** 0.5) if op.startswith("rand_like") else (0.0, 1.0)
    n = got.numel()
    assert abs(got.mean().item() - mean) < 6 * std / n ** 0.5
    assert abs(got.std().item() - std) < 6 * std / (2 * n) ** 0.5
