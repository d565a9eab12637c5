"""A compile server: a forked process that warms Triton's compiler once and then compiles
kernels on request, for one target, sending each binary back.

A fresh process's first Triton compile costs far more than the ones after it (importing the
compiler, hashing Triton's sources for its cache key, setting up MLIR and LLVM, the first ptxas
run), and most of a compile's front end holds the GIL. Warmed on a thread of the compiling
process, that work slowed the stages running beside it (docs/status.md). The server is forked as soon as a graph is known to go to the GPU
(:func:`fireclay_triton.warmup.prewarm`), warms up in its own process, forks its worker processes
once it is warm (each inherits the warm compiler), and compiles every later job: a batch of
several jobs in the workers, a single job in the server itself. The compiling process only loads the
binaries (:mod:`fireclay_triton.cuda_launch`).

Only compiling happens in the server: it never touches the GPU (the target comes from the
compiling process), and jobs cross the pipe as plain data (:class:`JobSpec`: the kernel's module
file and function name, the launch's argument types and options); the server imports the module
from its file. The server and its workers are one process group, killed together when a request
takes longer than :data:`TIMEOUT_S`, when the pipe breaks, or at exit; a caller that gets None
compiles in its own process instead.
"""

from __future__ import annotations

import atexit
import os
import signal
import socket
import sys
import threading
from dataclasses import dataclass
from multiprocessing.connection import Connection
from typing import Any

TIMEOUT_S = 300.0  # a request still unanswered after this stops the server (a compile may hang)

Result = tuple[str | None, Any]  # (error, KernelBinary or None) per job


@dataclass(frozen=True)
class JobSpec:
    """One compile job as plain data: ``function`` of the module in file ``path``, launched with
    ``args`` (dtypes for tensors, integers) and ``options`` (sorted constexpr and launch options)."""

    name: str
    path: str
    function: str
    args: tuple
    options: tuple

    @classmethod
    def of(cls, job: Any) -> JobSpec:
        """The spec of a :class:`fireclay_triton.precompile.CompileJob`."""
        fn = job.fn.fn  # the Python function under the @triton.jit
        return cls(job.name, fn.__code__.co_filename, fn.__name__, job.args, job.options)


# --- the server side ---------------------------------------------------------------------------

def _function(spec: JobSpec) -> Any:
    """The ``@triton.jit`` function ``spec`` names, its module imported from its file once (a
    module the compiling process had already imported when it forked the server is used as is)."""
    from fireclay_triton.kernel_modules import import_file

    known = next((m for m in list(sys.modules.values()) if getattr(m, "__file__", None) == spec.path), None)
    if known is None:
        known = import_file(spec.path, "fireclay_triton_served_" + os.path.splitext(os.path.basename(spec.path))[0])
    return getattr(known, spec.function)


def _compile_spec(spec: JobSpec, target: Any, binaries: bool) -> Result:
    """Compile one job for ``target``: (None, its binary or None) or (the error, None)."""
    from fireclay_triton import cuda_launch, precompile

    try:
        fn = _function(spec)
        compiled = precompile.compile_kernel(fn, precompile.mock_args(spec.args), dict(spec.options), target)
        return None, (cuda_launch.KernelBinary.of(compiled) if binaries else None)
    except Exception as error:
        return precompile.describe_failure(spec, error), None


def _compile_in_worker(request: tuple[JobSpec, Any, bool]) -> Result:
    return _compile_spec(*request)


def _warm_up(target: Any) -> None:
    """Compile one tiny kernel: the server's (and so its workers') one-time compiler costs."""
    from fireclay_triton import warmup

    try:
        warmup.compile_first_kernel(target)
    except Exception:  # a real job meets the same error and reports it
        pass


def _nothing(_: int) -> None:
    return None


def _start_pool(workers: int) -> Any:
    """``workers`` forked worker processes, started now (each inherits the warm compiler; forking
    them takes time better spent before the first request)."""
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor

    pool = ProcessPoolExecutor(workers, mp_context=multiprocessing.get_context("fork"))
    list(pool.map(_nothing, range(workers)))
    return pool


def _serve(conn: Connection, target: Any, workers: int) -> None:
    """The server's loop: answer each request (specs, binaries) with one result per spec, or None
    when its worker pool broke; return when the compiling process closes the pipe."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the compiling process decides when to stop
    _warm_up(target)
    pool = None
    if workers > 1:
        try:
            pool = _start_pool(workers)
        except Exception:  # tried again at the first request of several jobs
            pool = None
    try:
        while True:
            try:
                specs, binaries = conn.recv()
            except (EOFError, OSError):
                return
            try:
                if len(specs) > 1 and workers > 1:
                    pool = pool or _start_pool(workers)
                    results: list[Result] | None = list(pool.map(_compile_in_worker,
                                                                 [(s, target, binaries) for s in specs]))
                else:
                    results = [_compile_spec(s, target, binaries) for s in specs]
            except Exception:  # a broken worker pool: the caller compiles itself
                results = None
            conn.send(results)
    finally:
        if pool is not None:
            pool.shutdown(wait=False, cancel_futures=True)


# --- the compiling process's side ----------------------------------------------------------------

class CompileServer:
    """A running server for ``target`` (see the module doc). :meth:`compile` sends jobs and
    waits for their results; requests from several threads take turns."""

    def __init__(self, target: Any, workers: int):
        self.target = target
        self.workers = workers
        ours, theirs = socket.socketpair()
        pid = os.fork()
        if pid == 0:  # the server: its own process group, so that stopping it stops its workers
            try:
                ours.close()
                os.setpgid(0, 0)
                _serve(Connection(theirs.detach()), target, workers)
            finally:
                os._exit(0)
        theirs.close()
        try:
            os.setpgid(pid, pid)  # also here: the child may not have run yet
        except OSError:
            pass
        self.pid: int | None = pid
        self._conn: Connection | None = Connection(ours.detach())
        self._lock = threading.Lock()

    @property
    def alive(self) -> bool:
        return self._conn is not None

    def compile(self, jobs: list[Any], binaries: bool = True) -> list[Result] | None:
        """Compile ``jobs`` (``CompileJob``s) in the server: each job's (error, binary), in order;
        None when the server is gone, broke, or took longer than :data:`TIMEOUT_S` (it is then
        stopped, and the caller compiles the jobs itself)."""
        specs = [JobSpec.of(job) for job in jobs]
        with self._lock:
            if self._conn is None:
                return None
            try:
                self._conn.send((specs, binaries))
                if self._conn.poll(TIMEOUT_S):
                    results = self._conn.recv()
                    if results is not None and len(results) == len(specs):
                        return results
            except (OSError, EOFError, ValueError):
                pass
            self._stop()
            return None

    def stop(self) -> None:
        """Stop the server and its workers."""
        with self._lock:
            self._stop()

    def _stop(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None
        if self.pid is not None:
            try:
                os.killpg(self.pid, signal.SIGKILL)
            except OSError:
                pass
            try:
                os.waitpid(self.pid, 0)
            except OSError:
                pass
            self.pid = None


_servers: dict[Any, CompileServer | None] = {}  # target -> its server (None: it broke; not restarted)
_servers_lock = threading.Lock()


def server(target: Any, workers: int) -> CompileServer | None:
    """This process's server for ``target``, started (forked) on the first call; None when it
    cannot start or has broken (its callers then compile in their own process)."""
    with _servers_lock:
        if target in _servers:
            found = _servers[target]
            if found is not None and not found.alive:
                found = _servers[target] = None
            return found
        try:
            started: CompileServer | None = CompileServer(target, workers)
        except OSError:
            started = None
        _servers[target] = started
        return started


@atexit.register
def stop_all() -> None:
    """Stop every server (at exit; tests call it to start afresh)."""
    with _servers_lock:
        for found in _servers.values():
            if found is not None:
                found.stop()
        _servers.clear()
