"""Compiling a program's kernels before its first call, in parallel.

Triton compiles a ``@jit`` function the first time it is launched with a new specialization, on
the launching thread, one kernel and one config after another: a BERT-sized program spent most of
its first call there. Here every launch a program will make on its first call (each kernel, each
config its autotuning will try) is described as a :class:`CompileJob` at ``compile_program``
time, and compiled ahead:

* on a GPU, through ``triton.compile`` for the device's target, each binary then loaded for
  fireclay's own launches (:mod:`fireclay_triton.cuda_launch`), so the first call launches
  without compiling, and without Triton's driver utilities or host launchers, which Triton builds
  with the C compiler. Where the machine has 4 CPUs or more, the compiling is done by this
  process's compile server (:mod:`fireclay_triton.compile_server`: a forked process, warm before
  the first job comes when the fireclay backend started it, compiling a batch in forked workers),
  so that the Python front end of each compile never contends for this process's GIL; else on a
  thread pool (much of a compile runs outside the GIL: ptxas is a subprocess, the MLIR passes
  are native: docs/status.md). With
  ``config.direct_launch`` off launches go through Triton's ``fn[grid]``, and compiling
  ahead goes through Triton's ``warmup`` into the cache it reads;
* for a named target without a GPU (:func:`compile_for_target`, what ``benchmarks/compile_time.py``
  measures on a CPU machine), through ``triton.compile`` with the specialization the launch would
  compute, which fills Triton's on-disk cache.

A job that fails to compile is only reported: the launch then compiles it lazily as before and
raises (naming the kernel) if it fails again; autotuning skips a config that does not compile.
The interpreter (``TRITON_INTERPRET=1``) has nothing to compile and keeps the lazy path.
"""

from __future__ import annotations

import os
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import torch

from fireclay_triton import compile_server, cuda_launch, triton_key
from fireclay_triton.autotune import LaunchConfig, next_pow2
from fireclay_triton.config import config


@dataclass(frozen=True)
class CompileJob:
    """One launch to compile: kernel ``name``'s function with arguments like the launch's.

    ``args``: a ``torch.dtype`` where the launch passes a tensor (its pointer's type; its address
    is taken as 16-byte aligned, like every allocation of the caching allocator), an ``int`` where
    it passes an integer (Triton specializes on the value being 1 or a multiple of 16).
    ``options``: the constexprs and ``num_warps``/``num_stages`` of one config.
    """

    name: str
    fn: Any = field(compare=False, repr=False)
    args: tuple
    options: tuple  # sorted (key, value) pairs, so jobs hash

    @property
    def kwargs(self) -> dict[str, Any]:
        return dict(self.options)


@dataclass
class PrecompileReport:
    """What ahead-of-time compilation did: job count, seconds, and the failures (kernel: error)."""

    jobs: int = 0
    seconds: float = 0.0
    workers: int = 0
    failures: list[str] = field(default_factory=list)


# what this process compiled ahead, all programs together (read by benchmarks/compile_time.py)
TOTALS = {"programs": 0, "jobs": 0, "seconds": 0.0, "failures": 0}


def _count(report: PrecompileReport) -> PrecompileReport:
    TOTALS["programs"] += 1
    TOTALS["jobs"] += report.jobs
    TOTALS["seconds"] += report.seconds
    TOTALS["failures"] += len(report.failures)
    return report


def default_workers() -> int:
    """Threads to compile with: ``config.compile_threads``, else the usable CPU count."""
    if config.compile_threads:
        return max(1, config.compile_threads)
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:
        return max(1, os.cpu_count() or 1)


def launch_options(cfg: LaunchConfig, kind: str, checks: bool = False) -> tuple:
    """The keyword arguments a launcher passes for ``cfg`` (see ``runtime.Launcher._run``). A
    kernel with checks compiles in Triton's debug mode (``tl.device_assert`` is a no-op
    without it), without Triton's own integer-overflow asserts (eager wraps on overflow), as
    Inductor compiles its kernels with indirect-index asserts."""
    opts: dict[str, Any] = {"XBLOCK": cfg.XBLOCK, "num_warps": cfg.num_warps, "num_stages": cfg.num_stages}
    if checks:
        opts.update(debug=True, sanitize_overflow=False)
    if kind != "pointwise":
        opts["RBLOCK"] = cfg.RBLOCK
    return tuple(sorted(opts.items()))


def finisher_options(nsplit: int, xblock: int) -> tuple:
    """The keyword arguments a split reduction's finishing kernel is launched with."""
    return (("NSPLIT", next_pow2(nsplit)), ("XBLOCK", xblock), ("num_warps", 4))


def _unique(jobs: list[CompileJob]) -> list[CompileJob]:
    seen: dict[tuple, CompileJob] = {}
    for j in jobs:
        seen.setdefault((id(j.fn), j.args, j.options), j)
    return list(seen.values())


def mock_args(args: tuple) -> list[Any]:
    """A job's arguments as ``triton.compile`` takes them: a ``MockTensor`` for each dtype."""
    from triton.runtime.jit import MockTensor

    return [MockTensor(a) if isinstance(a, torch.dtype) else a for a in args]


def pool_kind(workers: int | None = None) -> str:
    """``config.compile_pool``: ``threads`` (in this process) or ``processes`` (the compile server,
    :mod:`fireclay_triton.compile_server`). Default: processes on a machine of at least 4 usable
    CPUs that can fork (faster there: docs/status.md), threads otherwise."""
    if config.compile_pool in ("threads", "processes"):
        return config.compile_pool
    return "processes" if (workers or default_workers()) >= 4 and hasattr(os, "fork") else "threads"


def describe_failure(job: Any, error: BaseException) -> str:
    """A failed job as the report lists it (the kernel's name first)."""
    return f"{job.name}: {type(error).__name__}: {str(error).strip()[:300]}"


def _served(jobs: list[CompileJob], target: Any, workers: int, pool: str | None,
            binaries: bool) -> dict[CompileJob, compile_server.Result] | None:
    """Each job's (error, binary) from the compile server for ``target``, when ``pool`` (else
    :func:`pool_kind`) says processes; None when jobs compile in this process (threads, or a
    server that cannot start or broke)."""
    if not jobs or not hasattr(os, "fork") or (pool or pool_kind(workers)) != "processes":
        return None
    server = compile_server.server(target, workers)
    results = server.compile(jobs, binaries) if server is not None else None
    return dict(zip(jobs, results)) if results is not None else None


def _keep(job: CompileJob, binary: cuda_launch.KernelBinary, device: int) -> None:
    """Keep ``job``'s binary where the launch it was compiled for will find (and load) it."""
    cuda_launch.remember_binary(job.fn, job.options, cuda_launch.job_key(device, job.args), binary,
                                job.fn.arg_names, len(job.args), device)


def precompile_on_device(jobs: list[CompileJob], workers: int | None = None, pool: str | None = None,
                         device: int | None = None) -> PrecompileReport:
    """Compile ``jobs`` for CUDA ``device`` (default: the current one), ``workers`` at a time, and
    load each binary for the launches to find (:mod:`fireclay_triton.cuda_launch`). Never raises
    for a kernel that fails: it is listed in the report."""
    jobs = _unique(jobs)
    report = PrecompileReport(jobs=len(jobs), workers=workers or default_workers())
    if not jobs:
        return report
    start = time.perf_counter()
    if not cuda_launch.enabled():
        _precompile_through_triton(jobs, report, pool)
        report.seconds = time.perf_counter() - start
        return _count(report)
    device = torch.cuda.current_device() if device is None else device
    target = cuda_target(device)
    served = _served(jobs, target, report.workers, pool, binaries=True)
    if served is not None:  # the server compiled them; this process only loads the binaries
        for job, (error, binary) in served.items():
            if error:
                report.failures.append(error)
                continue
            _keep(job, binary, device)  # loaded by its first launch, which reports what fails
        report.seconds = time.perf_counter() - start
        return _count(report)

    def one(job: CompileJob) -> str | None:
        try:
            _keep(job, cuda_launch.KernelBinary.of(_target_compile(job, target)), device)
            return None
        except Exception as error:  # reported; the launch compiles again and names the kernel
            return describe_failure(job, error)

    if report.workers == 1 or len(jobs) == 1:
        results = [one(j) for j in jobs]
    else:
        with ThreadPoolExecutor(min(report.workers, len(jobs)), thread_name_prefix="fireclay-triton-compile") as ex:
            results = list(ex.map(one, jobs))
    report.failures += [r for r in results if r]
    report.seconds = time.perf_counter() - start
    return _count(report)


def _precompile_through_triton(jobs: list[CompileJob], report: PrecompileReport, pool: str | None) -> None:
    """With launches going through Triton's ``fn[grid]`` (``config.direct_launch`` off):
    compile through Triton's ``warmup`` into the in-memory cache that launch reads, and build
    each signature's host launcher."""
    triton_key.install()
    served = _served(jobs, cuda_target(torch.cuda.current_device()), report.workers, pool, binaries=False) or {}
    report.failures += [error for error, _ in served.values() if error]
    jobs = [j for j in jobs if not served.get(j, (None,))[0]]
    try:
        from triton.runtime import _async_compile
    except ImportError:  # an older Triton: compile one after another, still before the first call
        _async_compile = None
    if _async_compile is None or report.workers == 1:
        kernels = [_warm(j, report) for j in jobs]
    else:
        with ThreadPoolExecutor(report.workers, thread_name_prefix="fireclay-triton-compile") as executor:
            mode = _async_compile.AsyncCompileMode(executor, ignore_errors=True)
            with mode:
                pending = [(j, _warm(j, report)) for j in jobs]
            kernels = []
            for j, future in pending:
                error = getattr(getattr(future, "future", None), "exception", lambda: None)()
                if error is not None:
                    report.failures.append(describe_failure(j, error))
                else:
                    kernels.append(future.result(ignore_errors=True) if hasattr(future, "result") else future)
    build_launchers(kernels, report.workers)


def build_launchers(kernels: list[Any], workers: int) -> int:
    """Build the host launcher of each distinct kernel signature, ``workers`` at a time.

    Triton launches a compiled kernel through a small C module made for its signature (argument
    types and specialized constants), built with the system C compiler when the kernel is first
    *run*, on the launching thread: with empty caches, half a second per distinct signature in
    the middle of the first call. Built here in parallel, each lands in Triton's cache, and the
    first launch only loads it. Best effort: a Triton without these internals, or a build that
    fails, leaves the launch to build it as before. Returns the number built."""
    try:
        from triton.runtime.driver import driver

        make = driver.active.launcher_cls
    except (ImportError, AttributeError):
        return 0
    distinct: dict[tuple, Any] = {}
    for k in kernels:
        src = getattr(k, "src", None)
        if src is None or getattr(k, "metadata", None) is None or not hasattr(src, "signature"):
            continue
        key = (repr(sorted(src.signature.items(), key=repr)),
               repr(sorted(getattr(src, "constants", {}).items(), key=repr)))
        distinct.setdefault(key, k)

    def one(k: Any) -> bool:
        try:
            make(k.src, k.metadata)
            return True
        except Exception:  # the launch builds it again and reports what fails
            return False

    with ThreadPoolExecutor(max(1, min(workers, len(distinct) or 1)),
                            thread_name_prefix="fireclay-triton-launchers") as executor:
        return sum(executor.map(one, distinct.values()))


def _warm(job: CompileJob, report: PrecompileReport) -> Any:
    try:
        return job.fn.warmup(*mock_args(job.args), grid=(1,), **job.kwargs)
    except Exception as error:  # reported; the launch compiles lazily and names the kernel
        report.failures.append(describe_failure(job, error))
        return None


def cuda_target(device: int) -> Any:
    """The Triton target of CUDA ``device``, from torch (asking Triton's driver would build its
    C utilities first)."""
    from triton.backends.compiler import GPUTarget

    major, minor = torch.cuda.get_device_capability(device)
    return GPUTarget("cuda", major * 10 + minor, 32)


def compile_kernel(fn: Any, args: list[Any], kwargs: dict[str, Any], target: Any) -> Any:
    """``triton.compile`` of ``fn`` for ``target`` with the specialization a launch with ``args``
    (tensors, or ``MockTensor``s standing for aligned ones, and integers) and ``kwargs`` (its
    constexprs and options) computes: Triton's own binder and argument packing, so the kernel
    and its cache key are the ones ``fn[grid](...)`` would compile. Needs no GPU."""
    import triton
    from triton import knobs
    from triton.compiler import ASTSource, make_backend
    from triton.runtime.jit import create_function_from_signature

    triton_key.install()
    backend = make_backend(target)
    kwargs = dict(kwargs)
    kwargs["debug"] = kwargs.get("debug", fn.debug) or knobs.runtime.debug
    kwargs["instrumentation_mode"] = knobs.compilation.instrumentation_mode
    binder = create_function_from_signature(fn.signature, fn.params, backend)
    bound, specialization, options = binder(*args, **kwargs)
    options, signature, constexprs, attrs = fn._pack_args(backend, kwargs, bound, specialization, options)
    return triton.compile(ASTSource(fn, signature, constexprs, attrs), target=target, options=options.__dict__)


def _target_compile(job: CompileJob, target: Any) -> Any:
    return compile_kernel(job.fn, mock_args(job.args), job.kwargs, target)


def compile_for_target(jobs: list[CompileJob], target: Any, workers: int | None = None,
                       pool: str | None = None) -> PrecompileReport:
    """Compile ``jobs`` for ``target`` (a ``triton.backends.compiler.GPUTarget``; no GPU needed)
    into Triton's on-disk cache, ``workers`` at a time (``pool``: see :func:`pool_kind`)."""
    jobs = _unique(jobs)
    report = PrecompileReport(jobs=len(jobs), workers=workers or default_workers())
    start = time.perf_counter()
    served = _served(jobs, target, report.workers, pool, binaries=False)
    if served is not None:
        report.failures = [error for error, _ in served.values() if error]
        report.seconds = time.perf_counter() - start
        return _count(report)

    def one(job: CompileJob) -> str | None:
        try:
            _target_compile(job, target)
            return None
        except Exception as error:
            return describe_failure(job, error)

    if report.workers == 1:
        results = [one(j) for j in jobs]
    else:
        with ThreadPoolExecutor(report.workers, thread_name_prefix="fireclay-triton-compile") as pool:
            results = list(pool.map(one, jobs))
    report.failures = [r for r in results if r]
    report.seconds = time.perf_counter() - start
    return _count(report)
