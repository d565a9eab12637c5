"""Kernels match eager on bad indices and zero divisors (issue 23, findings 4 and 5), in Triton's
interpreter on CPU tensors: an index read from a tensor outside its dimension fails a
``tl.device_assert`` (the launcher turns the interpreter's asserts on and raises the check's
error), and so does an integer division by zero of a CPU program (eager raises on the CPU). The
table is fireclay-loops' ``check_cases``; on a GPU, see ``test_device_assert_on_gpu``."""

from __future__ import annotations

import concurrent.futures
import os
import subprocess
import sys
import textwrap

import pytest

torch = pytest.importorskip("torch")
check_cases = pytest.importorskip("check_cases", reason="fireclay-loops' tests hold the check table")

from check_cases import (  # noqa: E402
    DIVISION_OPS,
    FALLBACK_INDEX_OPS,
    INDEX_OPS,
    check_against_eager,
    division_inputs,
    division_program,
    index_inputs,
    index_program,
)

from fireclay_loops import IndexOutOfBounds, IntegerDivisionByZero, config  # noqa: E402
from fireclay_triton import compile_program  # noqa: E402

interpreted = pytest.mark.skipif(os.environ.get("TRITON_INTERPRET") != "1",
                                 reason="runs kernels in Triton's interpreter (no CUDA GPU here)")
_COMPILED: dict[str, tuple] = {}


def _compiled(name: str, make):
    if name not in _COMPILED:
        builder, program = make()
        _COMPILED[name] = (builder, compile_program(program))
    return _COMPILED[name]


# (a subset of the values: the interpreter is slow, and the C++ suite runs them all)
@interpreted
@pytest.mark.parametrize("value", ["in_range", "last_negative", "below_negative", "huge"])
@pytest.mark.parametrize("op", INDEX_OPS, ids=lambda o: o.name)
def test_indirect_index_matches_eager(op, value):
    builder, compiled = _compiled(op.name, lambda: index_program(op))
    error = check_against_eager(compiled, builder, index_inputs(op, value), op.atol)
    if error is not None:
        assert isinstance(error, IndexOutOfBounds)
        assert f"index out of bounds for {op.site}" in str(error) and f"(size {op.size})" in str(error)
    assert (error is None) == (value == "in_range" or (value == "last_negative" and op.negative_ok))


@interpreted
@pytest.mark.parametrize("value", ["in_range", "last_negative", "huge"])
@pytest.mark.parametrize("op", FALLBACK_INDEX_OPS, ids=lambda o: o.name)
def test_indices_of_ops_torch_runs_raise_as_in_eager(op, value):
    """Scatter, index_put, index_add and the like are calls into torch's kernels: a bad index
    raises what eager raises (its type; the message is torch's), a good one gives eager's result."""
    builder, compiled = _compiled(op.name, lambda: index_program(op))
    error = check_against_eager(compiled, builder, index_inputs(op, value), op.atol)
    if value == "in_range":
        assert error is None


@interpreted
@pytest.mark.parametrize("zero", [False, True], ids=["nonzero", "zero"])
@pytest.mark.parametrize("op", [o for o in DIVISION_OPS if o.name in ("floor_divide", "remainder", "div_trunc",
                                                                      "float_div")], ids=lambda o: o.name)
def test_integer_division_by_zero_matches_eager(op, zero):
    builder, compiled = _compiled(op.name, lambda: division_program(op))
    error = check_against_eager(compiled, builder, division_inputs(op, zero))
    if error is not None:
        assert isinstance(error, IntegerDivisionByZero) and str(error).startswith("ZeroDivisionError")
    assert (error is not None) == (zero and not op.dtype.is_floating_point)


def test_kernels_with_checks_compile_in_debug_mode(monkeypatch):
    """Without Triton's debug option a ``tl.device_assert`` is compiled out: a kernel with checks
    is launched with it (and without Triton's int32 overflow asserts); with
    ``config.kernel_checks`` off, no asserts and no debug mode."""
    op = INDEX_OPS[3]  # embedding
    _, program = index_program(op)
    compiled = compile_program(program)
    assert "tl.device_assert" in compiled.kernel_source
    (launcher,) = compiled.launchers.values()
    from fireclay_triton.precompile import launch_options

    cfg = launcher.planned_configs(6, 1, None)[0]
    assert dict(launch_options(cfg, launcher.kind, bool(launcher.checks))).get("debug") is True
    monkeypatch.setattr(config, "kernel_checks", False)
    plain = compile_program(index_program(op)[1])
    assert "tl.device_assert" not in plain.kernel_source
    assert all(not k.checks for k in plain.kernels)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_bad_index_stops_the_gpu():
    """On a GPU a bad index is a device-side assert, as in eager. The CUDA context is lost, so each
    case runs in a child process (eight at a time): every op of the table with an index just past
    the end, one below the most negative legal one (ops that take negative indices), and one far
    out, each after an in-range call of the same compiled program."""
    cases = [(op, value) for op in INDEX_OPS for value in ("size", "below_negative", "huge")
             if value != "below_negative" or op.negative_ok]
    children = [f"""
        op = next(o for o in INDEX_OPS if o.name == {op.name!r})
        b, p = index_program(op, "cuda")
        compiled = compile_program(p)
        compiled(*[t.cuda() for t in index_inputs(op, "in_range")])
        torch.cuda.synchronize()
        print("in range ok", flush=True)
        compiled(*[t.cuda() for t in index_inputs(op, {value!r})])
        torch.cuda.synchronize()
        print("no assert", flush=True)
    """ for op, value in cases]
    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        runs = list(pool.map(_child, children))
    failed = [f"{op.name}/{value}: {run.stdout.strip()!r} {run.stderr[-600:]}" for (op, value), run in zip(cases, runs)
              if "in range ok" not in run.stdout or "no assert" in run.stdout or "device-side assert" not in run.stderr]
    assert not failed, "\n".join(failed)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_integer_division_by_zero_on_gpu_gives_a_value():
    """eager's CUDA kernels give a value for an integer division by zero; so do ours."""
    run = _child("""
        d = DIVISION_OPS[0]
        b, p = division_program(d, "cuda")
        compile_program(p)(*[t.cuda() for t in division_inputs(d, True)])
        torch.cuda.synchronize()
        print("divided", flush=True)
    """)
    assert "divided" in run.stdout, run.stderr[-2000:]


def _child(body: str) -> subprocess.CompletedProcess:
    script = textwrap.dedent("""
        import sys, torch
        sys.path[:0] = %r
        from check_cases import INDEX_OPS, index_inputs, index_program, DIVISION_OPS, division_inputs, division_program
        from fireclay_triton import compile_program
    """) % (sys.path,) + textwrap.dedent(body)
    return subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=600)


# Electra's embedding block at a small size (embedding dim 32 as in the benchmark's electra):
# word, token-type and position lookups (each checked), their sum, a layer norm, and the
# additive attention mask of the same graph (a 0 / -inf constant in the model's dtype).
_HALF_TOLERANCE = {torch.float32: 1e-5, torch.float16: 2e-3, torch.bfloat16: 2e-2}


def _embedding_block(dtype: torch.dtype):
    from aten_builder import AtenBuilder

    b = AtenBuilder()
    ids = b.input(torch.empty(2, 8, dtype=torch.int64), "ids")
    types = b.input(torch.empty(2, 8, dtype=torch.int64), "types")
    pos = b.input(torch.empty(1, 8, dtype=torch.int64), "pos")
    mask = b.input(torch.empty(2, 8, dtype=torch.int64), "mask")
    words, kinds, places = (b.input(torch.empty(n, 32, dtype=dtype), name)
                            for n, name in ((300, "words"), (2, "kinds"), (20, "places")))
    weight, bias = b.input(torch.empty(32, dtype=dtype), "w"), b.input(torch.empty(32, dtype=dtype), "b")
    summed = b.call("add.Tensor", b.call("add.Tensor", b.call("embedding.default", words, ids),
                                         b.call("embedding.default", kinds, types)),
                    b.call("embedding.default", places, pos))
    normed = b.call("native_layer_norm.default", summed, [32], weight, bias, 1e-12)[0]
    keep = b.call("ne.Scalar", mask, 0)
    # as scaled_dot_product_attention's decomposition turns a boolean mask into an additive one
    additive = b.call("where.self", keep, b.call("scalar_tensor.default", 0.0, dtype=dtype),
                      b.call("scalar_tensor.default", float("-inf"), dtype=dtype))
    return b, b.output(normed, additive)


def _embedding_block_inputs(dtype: torch.dtype, word: int | None) -> list[torch.Tensor]:
    gen = torch.Generator().manual_seed(1)
    ids = torch.randint(1, 300, (2, 8), generator=gen)
    if word is not None:
        ids[1, 3] = word
    mask = torch.ones(2, 8, dtype=torch.int64)
    mask[1, 6:] = 0
    tables = [torch.randn(n, 32, generator=gen).to(dtype) for n in (300, 2, 20)]
    return [ids, torch.randint(0, 2, (2, 8), generator=gen), torch.arange(8).view(1, 8) * 2, mask, *tables,
            torch.randn(32, generator=gen).to(dtype), torch.randn(32, generator=gen).to(dtype)]


@interpreted
@pytest.mark.parametrize("word", [None, 299, 300, -1], ids=["in_range", "last", "past_end", "negative"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16], ids=str)
def test_embedding_block_in_each_precision_matches_eager(dtype, word):
    """The block runs in every precision (bfloat16 constants included, which Triton's
    interpreter could not build) and matches eager; a word index outside the table raises
    eager's IndexError from the embedding's check, an in-range one (the last row too) never does."""
    builder, compiled = _compiled(f"embedding_block_{dtype}", lambda: _embedding_block(dtype))
    inputs = _embedding_block_inputs(dtype, word)
    if word in (300, -1):
        with pytest.raises(IndexOutOfBounds, match=r"dimension 0 of embedding.*\(size 300\)"):
            compiled(*inputs)
        return
    got, want = compiled(*inputs), builder.eager(*inputs)
    for g, w in zip(got, want):
        assert g.dtype == w.dtype
        torch.testing.assert_close(g, w, rtol=_HALF_TOLERANCE[dtype], atol=_HALF_TOLERANCE[dtype])
