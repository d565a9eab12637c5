"""What a compile is doing: each graph's stages, timed and shown.

- ``FIRECLAY_LOG=stage_times`` logs every stage's own time per graph (``fireclay.stage_times``).
- ``FIRECLAY_LOG=output_code`` logs where each graph's generated code was written
  (``fireclay.output_code``); ``config.debug_dir`` writes every stage's program and the generated
  kernels and wrapper of each graph under that folder.
- On a terminal, a compile that has run longer than ``PROGRESS_AFTER_S`` shows one line saying
  which graph and stage it is in (``config.show_progress``; never when stderr is not a terminal
  or the ``CI`` environment variable is set).

A graph is one program handed to the ``fireclay`` backend (a captured frame, or a TorchDynamo
graph); its stages are capture, autograd, loops and cpp/triton.

Listeners (:func:`add_listener`) are told what each compile really did, as it happens: every
stage's own time (:class:`StageTimed`), every program a stage made (:class:`ProgramMade`:
captured, aten forward/backward/inference, loops) and every generated code (:class:`CodeMade`).
The HTML report (``fireclay.report``) records a script's run through them.
"""

from __future__ import annotations

import contextlib
import dataclasses
import itertools
import logging
import os
import re
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from typing import Any

from fireclay.config import config

times_log = logging.getLogger("fireclay.stage_times")
code_log = logging.getLogger("fireclay.output_code")
hints_log = logging.getLogger("fireclay.perf_hints")

PROGRESS_AFTER_S = 2.0


@dataclasses.dataclass
class GraphRecord:
    """One graph the backend compiles: a number in this process, its function and place."""

    index: int
    function: str
    where: str
    parts: itertools.count = dataclasses.field(default_factory=lambda: itertools.count())

    @property
    def label(self) -> str:
        return f"graph {self.index} ({self.function} at {self.where})"

    @property
    def folder_name(self) -> str:
        return f"graph-{self.index:03d}-{re.sub(r'[^A-Za-z0-9_.-]+', '_', self.function)[:60]}"


_graph_numbers = itertools.count(1)


# -- listeners


@dataclasses.dataclass
class StageTimed:
    """A stage ended: its own time (``seconds``, nested stages left out) and its span."""

    stage: str
    label: str  # the graph's label (GraphRecord.label), or the captured frame's for "capture"
    seconds: float
    started: float  # time.perf_counter() at its start
    ended: float


@dataclasses.dataclass
class ProgramMade:
    """A stage made ``program`` for graph ``record``: kind "captured", "aten forward",
    "aten backward", "aten inference", or "loops <role>"."""

    record: GraphRecord
    kind: str
    program: Any


@dataclasses.dataclass
class CodeMade:
    """A code generator compiled ``compiled`` (its ``source_files()``: kernels, wrapper,
    schedule) for the aten program of role ``kind`` of graph ``record``."""

    record: GraphRecord
    kind: str
    language: str  # "cpp" or "triton"
    compiled: Any


_listeners: list[Any] = []


def add_listener(listener: Any) -> None:
    """Call ``listener(event)`` with every StageTimed, ProgramMade and CodeMade (idempotent)."""
    if listener not in _listeners:
        _listeners.append(listener)


def remove_listener(listener: Any) -> None:
    if listener in _listeners:
        _listeners.remove(listener)


def listening() -> bool:
    """Whether some listener wants events (so that a program worth showing is worth building)."""
    return bool(_listeners)


def _tell(event: Any) -> None:
    for listener in list(_listeners):
        try:
            listener(event)
        except Exception:  # a listener's failure must not fail the compile it watches
            logging.getLogger("fireclay").debug("a stage listener failed", exc_info=True)


def program_made(record: GraphRecord, kind: str, program: Any) -> None:
    """Tell listeners about ``program`` and save it under ``config.debug_dir``."""
    write_program(record, kind.split()[0], program)  # debug_dir names files by stage: aten, loops
    if _listeners:
        _tell(ProgramMade(record, kind, program))


def code_made(record: GraphRecord, kind: str, language: str, compiled: Any) -> None:
    """Tell listeners about generated code and write it out (``debug_dir``, ``output_code``)."""
    write_code(record, language, compiled)
    if _listeners:
        _tell(CodeMade(record, kind, language, compiled))


def new_graph(program: Any, where: str) -> GraphRecord:
    capture = program.metadata.get("capture", {}) if hasattr(program, "metadata") else {}
    if capture.get("file"):  # the captured function's own place, not its first op's
        where = f"{capture['file']}:{capture.get('line')}"
    return GraphRecord(index=next(_graph_numbers), function=capture.get("function") or "graph", where=where)


# -- stages and their times


@dataclasses.dataclass
class _Running:
    stage: str
    label: str
    start: float
    children_s: float = 0.0


_stacks: dict[int, list[_Running]] = {}
_lock = threading.Lock()


@contextlib.contextmanager
def stage(name: str, label: str) -> Iterator[None]:
    """Time stage ``name`` of the graph ``label``; its own time (nested stages left out) is logged
    at INFO on ``fireclay.stage_times``."""
    running = _begin(name, label)
    try:
        yield
    finally:
        _end(running)


def _begin(name: str, label: str) -> _Running:
    running = _Running(name, label, time.perf_counter())
    ident = threading.get_ident()
    with _lock:
        stack = _stacks.setdefault(ident, [])
        stack.append(running)
        outermost = len(stack) == 1
    if outermost and _progress_wanted():
        _progress.watch()
    return running


def begin(name: str, label: str) -> _Running:
    """Start stage ``name`` where a ``with`` block cannot hold it (the autograd stage, begun and
    ended by the compile cache's load and store); end it with :func:`end`."""
    return _begin(name, label)


def end(running: _Running | None) -> None:
    if running is not None:
        _end(running)


def forget_unfinished() -> None:
    """Drop this thread's stages left open by a compile that raised (called where a new outermost
    compile starts), so that they neither nest the next stages nor keep the progress line up."""
    ident = threading.get_ident()
    if _capture_runs.get(ident):
        return
    with _lock:
        _stacks.pop(ident, None)


def _end(running: _Running) -> None:
    now = time.perf_counter()
    total = now - running.start
    ident = threading.get_ident()
    with _lock:
        stack = _stacks.get(ident, [])
        if running in stack:
            stack.remove(running)
        if stack:
            stack[-1].children_s += total
        else:
            _stacks.pop(ident, None)
    if times_log.isEnabledFor(logging.INFO):
        times_log.info("%s: %s took %.3f s", running.label, running.stage, total - running.children_s)
    if _listeners:
        _tell(StageTimed(running.stage, running.label, total - running.children_s, running.start, now))


_capture_runs: dict[int, list[_Running]] = {}


def _on_capture(event: str, captured: Any, seconds: float) -> None:
    """fireclay-capture's listener: a frame's capture is the first stage of its graphs."""
    code = getattr(captured, "code", None)
    label = (f"{code.co_qualname} at {code.co_filename}:{code.co_firstlineno}" if code is not None
             else "a frame")
    if event == "start":
        forget_unfinished()
    runs = _capture_runs.setdefault(threading.get_ident(), [])
    if event == "start":
        runs.append(_begin("capture", label))
    elif runs:
        _end(runs.pop())


def install() -> None:
    """Listen to fireclay-capture's captures (idempotent)."""
    from fireclay_capture.api import add_capture_listener

    add_capture_listener(_on_capture)


# -- progress on a terminal


def _progress_wanted() -> bool:
    if not config.show_progress or os.environ.get("CI"):
        return False
    stream = sys.stderr
    try:
        return bool(stream.isatty())
    except (AttributeError, ValueError):
        return False


class _Progress:
    """A daemon thread that, while some thread is compiling and the compile has run longer than
    PROGRESS_AFTER_S, rewrites one stderr line with the innermost stage; it clears the line when
    the compile ends."""

    def __init__(self) -> None:
        self._thread: threading.Thread | None = None
        self._wake = threading.Event()
        self.shown = False

    def watch(self) -> None:
        if self._thread is None or not self._thread.is_alive():
            self._thread = threading.Thread(target=self._loop, name="fireclay-progress", daemon=True)
            self._thread.start()
        self._wake.set()

    def line(self) -> str | None:
        """The text to show now, or None when nothing has run long enough."""
        now = time.perf_counter()
        with _lock:
            stacks = [list(s) for s in _stacks.values() if s]
        if not stacks:
            return None
        stack = max(stacks, key=lambda s: now - s[0].start)
        elapsed = now - stack[0].start
        if elapsed < PROGRESS_AFTER_S:
            return None
        inner = stack[-1]
        return f"[fireclay] compiling {inner.label}: {inner.stage} ({elapsed:.1f} s)"

    def _loop(self) -> None:
        while True:
            text = self.line()
            if text is not None:
                width = 200
                try:
                    width = os.get_terminal_size(sys.stderr.fileno()).columns - 1
                except (OSError, ValueError, AttributeError):
                    pass
                self._write("\r\x1b[K" + text[:width])
                self.shown = True
            elif self.shown:
                self._write("\r\x1b[K")
                self.shown = False
            with _lock:
                idle = not any(_stacks.values())
            if idle and not self.shown:
                self._wake.clear()
                self._wake.wait()
            else:
                time.sleep(0.25)

    @staticmethod
    def _write(text: str) -> None:
        try:
            sys.stderr.write(text)
            sys.stderr.flush()
        except (OSError, ValueError):
            pass


_progress = _Progress()


# -- files of each stage (config.debug_dir, the output_code channel)

_output_code_root: str | None = None


def _code_root() -> str | None:
    """Where generated code goes: ``config.debug_dir``, else (output_code logging on) one
    temporary folder per process, else nowhere."""
    global _output_code_root
    if config.debug_dir:
        return config.debug_dir
    if not code_log.isEnabledFor(logging.INFO):
        return None
    if _output_code_root is None:
        _output_code_root = tempfile.mkdtemp(prefix="fireclay-output-code-")
    return _output_code_root


def write_program(record: GraphRecord, kind: str, program: Any) -> str | None:
    """Save one stage's program under ``debug_dir`` (``<graph folder>/<n>-<kind>.fcir.json``)."""
    if not config.debug_dir:
        return None
    import fireclay_ir

    folder = os.path.join(config.debug_dir, record.folder_name)
    os.makedirs(folder, exist_ok=True)
    path = os.path.join(folder, f"{next(record.parts):02d}-{kind}.fcir.json")
    try:
        fireclay_ir.save(program, path)
    except Exception as exc:  # a program the format cannot hold must not fail the compile
        with open(path + ".txt", "w") as f:
            f.write(f"# could not save ({type(exc).__name__}: {exc}); text form:\n")
            f.write(fireclay_ir.format_program(program))
        return path + ".txt"
    return path


def write_code(record: GraphRecord, kind: str, compiled: Any) -> str | None:
    """Write a compiled program's kernels and wrapper (its ``dump``) beside the graph's programs,
    and log the folder on ``fireclay.output_code``."""
    root = _code_root()
    dump = getattr(compiled, "dump", None)
    if root is None or dump is None:
        return None
    folder = os.path.join(root, record.folder_name, f"{next(record.parts):02d}-{kind}")
    paths = dump(folder)
    code_log.info("%s: %s code written to %s (%s)", record.label, kind, folder,
                  ", ".join(os.path.basename(p) for p in paths))
    return folder
