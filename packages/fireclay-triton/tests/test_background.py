"""Compiling kernels in the background (``compile_program(..., background=True)``): it returns
before the kernels compile, says when the program is ready, keeps a failure as "not usable"
(never raised on the background thread or in the middle of a call), and ``wait_compiled`` waits
for every pending compile.

Triton's interpreter has nothing to compile, so the compile step is replaced by a fake that
waits on an event (a slow compile the test releases) or raises (a failed compile); outputs are
those of the interpreted kernels, checked against eager before and after."""

import os
import threading

import pytest
import torch
from programs import PROGRAMS, build_program

import fireclay_triton
from fireclay_triton import CodegenError, compile_program
from fireclay_triton import api as triton_api

interpreted = pytest.mark.skipif(os.environ.get("TRITON_INTERPRET") != "1",
                                 reason="runs kernels in Triton's interpreter (no CUDA GPU here)")

CASES = [p for p in PROGRAMS if p.id in ("pointwise_ragged_15000", "softmax_many_short_rows", "mm_bias_relu",
                                           "residual_norm_gelu", "several_reductions")]


class FakeCompile:
    """Stands in for compiling a program's kernels ahead: records each call, waits until
    released, then returns or raises ``error``."""

    def __init__(self, error: BaseException | None = None):
        self.release = threading.Event()
        self.started = threading.Event()
        self.calls: list[tuple] = []
        self.threads: list[str] = []
        self.error = error

    def __call__(self, compiled, cfg, interpret):
        self.calls.append((compiled, interpret))
        self.threads.append(threading.current_thread().name)
        self.started.set()
        assert self.release.wait(60), "the test never released the fake compile"
        if self.error is not None:
            raise self.error
        return None


@pytest.fixture
def fake(monkeypatch):
    fakes: list[FakeCompile] = []

    def make(error: BaseException | None = None) -> FakeCompile:
        f = FakeCompile(error)
        fakes.append(f)
        monkeypatch.setattr(triton_api, "_compile_ahead", f)
        return f

    yield make
    for f in fakes:  # never leave the background thread blocked for the next test
        f.release.set()
    assert fireclay_triton.wait_compiled(60)


def _check(got, want, atol, rtol):
    assert len(got) == len(want)
    for g, w in zip(got, want):
        assert g.dtype == w.dtype and g.shape == w.shape
        torch.testing.assert_close(g, w, atol=atol, rtol=rtol)


@interpreted
@pytest.mark.parametrize("fn,inputs,atol,rtol", CASES)
def test_returns_before_the_kernels_compile_and_runs_once_ready(fn, inputs, atol, rtol, fake):
    slow = fake()
    b, program, tensors = build_program(fn, inputs, "cpu")
    compiled = compile_program(program, tensors, background=True)
    assert slow.started.wait(60)  # the compile runs on the background thread, not in compile_program
    assert slow.threads == ["fireclay-triton-background_0"] and slow.calls[0][0] is compiled
    assert not compiled.ready() and compiled.compile_error is None
    assert compiled.wait(0) is False
    slow.release.set()
    assert compiled.wait(60) and compiled.ready() and compiled.compile_error is None
    for seed in (1, 2):  # fresh inputs after the switch
        _, _, fresh = build_program(fn, inputs, "cpu", seed=seed)
        _check(compiled(*fresh), b.eager(*fresh), atol, rtol)


@interpreted
def test_a_call_before_ready_waits_for_the_compile(fake):
    slow = fake()
    fn, inputs, atol, rtol = CASES[0].values
    b, program, tensors = build_program(fn, inputs, "cpu")
    compiled = compile_program(program, tensors, background=True)
    results = []
    caller = threading.Thread(target=lambda: results.append(compiled(*tensors)))
    caller.start()
    caller.join(0.2)
    assert caller.is_alive() and not results  # blocked: the compile has not been released
    slow.release.set()
    caller.join(60)
    assert not caller.is_alive()
    _check(results[0], b.eager(*tensors), atol, rtol)


@interpreted
@pytest.mark.parametrize("error", [CodegenError("kernel k2 does not compile with any launch config: out of resources"),
                                   RuntimeError("ptxas crashed")], ids=["no_config_compiles", "compiler_crash"])
def test_a_failed_background_compile_makes_the_program_unusable(error, fake):
    failing = fake(error)
    fn, inputs, _, _ = CASES[1].values
    _, program, tensors = build_program(fn, inputs, "cpu")
    compiled = compile_program(program, tensors, background=True)  # nothing raised here
    failing.release.set()
    assert compiled.wait(60) and compiled.ready()
    assert compiled.compile_error is error
    for _ in range(2):  # refused every time, naming the cause, before any kernel runs
        with pytest.raises(CodegenError, match="failed to compile in the background") as raised:
            compiled(*tensors)
        assert str(error) in str(raised.value) and raised.value.__cause__ is error


@interpreted
def test_without_background_the_compile_runs_before_returning(fake):
    ahead = fake()
    ahead.release.set()
    fn, inputs, atol, rtol = CASES[2].values
    b, program, tensors = build_program(fn, inputs, "cpu")
    compiled = compile_program(program, tensors)
    assert ahead.threads == [threading.current_thread().name]  # in the caller, before returning
    assert compiled.background is None and compiled.ready() and compiled.wait(0) and compiled.compile_error is None
    _check(compiled(*tensors), b.eager(*tensors), atol, rtol)


@interpreted
def test_a_foreground_failure_still_raises_at_compile_time(fake):
    failing = fake(CodegenError("kernel k0 does not compile with any launch config: boom"))
    failing.release.set()
    fn, inputs, _, _ = CASES[0].values
    _, program, tensors = build_program(fn, inputs, "cpu")
    with pytest.raises(CodegenError, match="k0 does not compile"):
        compile_program(program, tensors)


@interpreted
def test_wait_compiled_waits_for_every_pending_compile(fake):
    first = fake()
    fn, inputs, atol, rtol = CASES[3].values
    b, program, tensors = build_program(fn, inputs, "cpu")
    one = compile_program(program, tensors, background=True)
    assert first.started.wait(60)  # (the background thread looks the compile step up when it starts)
    second = fake()
    other = compile_program(program, tensors, background=True)
    assert fireclay_triton.wait_compiled(0) is False
    first.release.set()
    assert one.wait(60)
    assert fireclay_triton.wait_compiled(0) is False and not other.ready()  # queued after the first
    second.release.set()
    assert fireclay_triton.wait_compiled(60) is True
    assert one.ready() and other.ready() and [c for c, _ in second.calls] == [other]
    for compiled in (one, other):
        _check(compiled(*tensors), b.eager(*tensors), atol, rtol)


@interpreted
def test_the_real_compile_step_has_nothing_to_do_in_the_interpreter():
    fn, inputs, atol, rtol = CASES[4].values
    b, program, tensors = build_program(fn, inputs, "cpu")
    compiled = compile_program(program, tensors, background=True)
    assert compiled.wait(60) and compiled.compile_error is None and compiled.precompile_report is None
    _check(compiled(*tensors), b.eager(*tensors), atol, rtol)


@pytest.mark.skipif(not torch.cuda.is_available() or os.environ.get("TRITON_INTERPRET") == "1",
                    reason="compiles kernels on a CUDA GPU")
@pytest.mark.parametrize("fn,inputs,atol,rtol", CASES)
def test_background_compile_on_the_gpu_gives_the_foreground_result(fn, inputs, atol, rtol):
    b, program, tensors = build_program(fn, inputs, "cuda")
    compiled = compile_program(program, tensors, background=True)
    assert compiled.wait(300) and compiled.compile_error is None
    assert compiled.precompile_report is None or not compiled.precompile_report.failures
    _check(compiled(*tensors), b.eager(*tensors), atol, rtol)
