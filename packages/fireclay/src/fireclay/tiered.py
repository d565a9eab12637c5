"""Tiered execution: an aten graph runs in the interpreter while its kernels compile in the
background, then on its compiled kernels.

Compiling a CUDA graph's Triton kernels takes seconds (a BERT forward: 12 kernel/config compiles,
about 1.4 s on 16 threads, more in a fresh process), and without tiering the first call waits
for all of it. With ``config.background_compile`` (the default on CUDA outside
``mode="reduce-overhead"``), the ``fireclay`` backend asks fireclay-triton to compile in the
background and wraps the program in a :class:`TieredGraph`: each call runs the graph's aten
program in the interpreter (the same path a graph takes when code generation fails) until the
kernels are ready; the first call after that runs the compiled program (which autotunes then,
as it always does at its first call), and so does every later call.

Both paths run the same functional aten program, so input mutation and aliased outputs are
handled alike (by fireclay-autograd's runtime around either). Random ops draw from torch's
generator in the interpreter and from Philox streams seeded by it in the kernels: each path is
correct, their streams differ (as they do between eager and compiled code).

A background compile that fails is never an error in the middle of a call: the graph stays on
the interpreter for good and one warning names the cause. :func:`wait_compiled` blocks until
every pending compile has finished (benchmarks call it before timing steady-state calls).
"""

from __future__ import annotations

import logging
import threading
import time
import weakref
from collections.abc import Callable, Sequence
from typing import Any

log = logging.getLogger("fireclay")

Compiled = Callable[..., Sequence[Any]]

# Tiered graphs that have not yet run a call on their final path.
_unsettled: weakref.WeakSet[TieredGraph] = weakref.WeakSet()
_lock = threading.Lock()
_started = 0  # tiered graphs made in this process
_reported = 0  # ... of which wait_compiled has already counted


class TieredGraph:
    """One aten graph whose compiled program is compiling in the background.

    ``compiled``: a program with ``ready()``, ``wait(timeout)`` and ``compile_error`` (what
    ``fireclay_triton.compile_program(..., background=True)`` returns); ``interpreted``: the same
    graph in the interpreter; ``where``: the user's code the graph came from, for messages.
    """

    def __init__(self, compiled: Any, interpreted: Compiled, where: str):
        self.compiled = compiled
        self.interpreted = interpreted
        self.where = where
        self.interpreted_calls = 0
        self.failed: BaseException | None = None
        self._final: Compiled | None = None  # the path every call takes, once chosen
        global _started
        with _lock:
            _unsettled.add(self)
            _started += 1

    def __call__(self, *inputs: Any) -> Sequence[Any]:
        final = self._final
        if final is not None:
            return final(*inputs)
        if not self.compiled.ready():
            self.interpreted_calls += 1
            return self.interpreted(*inputs)
        return self._switch(inputs)

    def _switch(self, inputs: tuple) -> Sequence[Any]:
        error = self.compiled.compile_error
        if error is None:
            final = self.compiled
            log.info("fireclay: the kernels of the graph from %s are compiled; it runs them from now on "
                     "(%d calls ran in the interpreter meanwhile)", self.where, self.interpreted_calls)
        else:
            self.failed = error
            final = self.interpreted
            first = str(error).splitlines()[0] if str(error) else ""
            log.warning("fireclay: compiling the kernels of the graph from %s in the background failed (%s: %s); "
                        "that graph runs in the interpreter from now on", self.where, type(error).__name__, first)
        result = final(*inputs)
        # Chosen once a call has run on it: a backward compiled after this sees its layouts.
        self._final = final
        with _lock:
            _unsettled.discard(self)
        return result

    def settled(self) -> bool:
        """Whether a call has run on the path every later call takes (the compiled program, or the
        interpreter after a failed compile). fireclay-autograd compiles a backward only after its
        forward settled, for the layouts the settled forward produces."""
        return self._final is not None

    def wait(self, timeout: float | None = None) -> bool:
        """Block until the background compile has finished or ``timeout`` seconds passed."""
        return self.compiled.wait(timeout)


def tiered(compiled: Any, interpreted: Callable[[], Compiled], where: str) -> Compiled:
    """``compiled`` behind a :class:`TieredGraph` when its background compile is still running;
    else ``compiled`` itself, or the interpreter (``interpreted()`` makes it) with a warning when
    that compile already failed."""
    if compiled.ready():
        error = compiled.compile_error
        if error is None:
            return compiled
        first = str(error).splitlines()[0] if str(error) else ""
        log.warning("fireclay: compiling the kernels of the graph from %s failed (%s: %s); running it in the "
                    "interpreter instead", where, type(error).__name__, first)
        return interpreted()
    return TieredGraph(compiled, interpreted(), where)


def wait_compiled(timeout: float | None = None) -> int:
    """Block until every background compile started so far has finished; returns how many graphs
    started compiling since the previous call (each runs its kernels from its next call on). 0
    means nothing new: every graph already runs the code it keeps. Raises ``TimeoutError`` when
    ``timeout`` seconds pass first.

    A backward starts compiling at its first call after its forward switched to its kernels (so
    that it is compiled for the layouts the compiled forward produces), so a training loop takes
    a few steps to run compiled throughout. Before timing steady-state calls::

        step()
        while fireclay.wait_compiled():
            step()
    """
    global _reported
    deadline = None if timeout is None else time.monotonic() + timeout
    with _lock:
        pending = list(_unsettled)
    for graph in pending:
        left = None if deadline is None else max(0.0, deadline - time.monotonic())
        if not graph.wait(left):
            raise TimeoutError(f"the kernels of the graph from {graph.where} were still compiling after "
                               f"{timeout} s")
    with _lock:
        started, _reported = _started - _reported, _started
    return started


def pending_graphs() -> int:
    """How many tiered graphs have not settled yet (for reports and tests)."""
    with _lock:
        return len(_unsettled)
