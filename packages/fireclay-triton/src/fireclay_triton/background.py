"""Compiling a program's kernels in the background, while its caller runs the graph another way.

``compile_program(..., background=True)`` generates the kernels and the wrapper as it always does,
then, instead of compiling every launch of the first call before returning
(:mod:`fireclay_triton.precompile`), hands that work to one background thread and returns at once.
The caller asks the program whether it is ready (``ready()``, ``wait()``) and runs the graph some
other way until then (the fireclay umbrella runs the aten program in its interpreter). Once ready,
the program's first call autotunes and runs as a program compiled in the foreground does.

Programs compile one after another on that thread, each with the whole compile pool
(``FIRECLAY_TRITON_COMPILE_THREADS``): the first submitted (a model's forward) is ready first,
and a later one does not slow it down. Much of a Triton compile runs outside the GIL (ptxas, the
MLIR passes), so the caller's thread keeps running meanwhile.

A failure is kept, never raised on the background thread or in the middle of a call:
``compile_error`` holds it, and the program refuses to run (one clear error, before any kernel
ran). :func:`wait_all` blocks until everything submitted so far has finished.
"""

from __future__ import annotations

import concurrent.futures
import threading
import time
from collections.abc import Callable
from typing import Any

_lock = threading.Lock()
_executor: concurrent.futures.ThreadPoolExecutor | None = None
_submitted: set[concurrent.futures.Future] = set()


def _pool() -> concurrent.futures.ThreadPoolExecutor:
    global _executor
    with _lock:
        if _executor is None:
            _executor = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="fireclay-triton-background")
        return _executor


class BackgroundCompile:
    """One program's compile work, running (or queued) on the background thread."""

    def __init__(self, future: concurrent.futures.Future):
        self._future = future

    def done(self) -> bool:
        """Whether the work has finished, successfully or not."""
        return self._future.done()

    def wait(self, timeout: float | None = None) -> bool:
        """Block until the work has finished or ``timeout`` seconds passed; returns ``done()``."""
        concurrent.futures.wait([self._future], timeout=timeout)
        return self._future.done()

    @property
    def error(self) -> BaseException | None:
        """What the work raised, once it finished (None while running, or when it succeeded)."""
        if not self._future.done():
            return None
        return self._future.exception()


def submit(work: Callable[[], Any]) -> BackgroundCompile:
    """Run ``work()`` on the background thread, after the work submitted before it."""
    future = _pool().submit(work)
    with _lock:
        _submitted.add(future)
    future.add_done_callback(_forget)
    return BackgroundCompile(future)


def _forget(future: concurrent.futures.Future) -> None:
    with _lock:
        _submitted.discard(future)


def pending() -> int:
    """How many submitted compiles have not finished yet."""
    with _lock:
        return len(_submitted)


def wait_all(timeout: float | None = None) -> bool:
    """Block until every compile submitted so far has finished (True), or ``timeout`` seconds
    passed (False). Failed compiles count as finished: each program keeps its own error."""
    deadline = None if timeout is None else time.monotonic() + timeout
    while True:
        with _lock:
            futures = list(_submitted)
        if not futures:
            return True
        left = None if deadline is None else max(0.0, deadline - time.monotonic())
        _, not_done = concurrent.futures.wait(futures, timeout=left)
        if not_done and deadline is not None and time.monotonic() >= deadline:
            return False
