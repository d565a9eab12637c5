"""Collecting a compile's events: run the stages over a program for inspection, and record the
captures of ``fireclay.compile`` calls.

:func:`inspect_program` takes one captured (torch-dialect) program through autograd -> loops ->
kernel generation, timing each stage and keeping every intermediate graph and generated source.
It generates kernel source without building it, so it works without a C++ compiler or a GPU.

:class:`Recorder` wraps ``fireclay.compile``: the backend is wrapped so that each capture's
program, inputs and backend time are seen, and the compiled callable's cache (guards, frames run
eagerly, recompiles) is read afterwards. ``recording()`` makes every ``fireclay.compile`` call
made inside it go through a recorder (used by ``fireclay report SCRIPT.py``).
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import re
import threading
import time
import weakref
from collections.abc import Callable, Iterator
from typing import Any

import torch

from fireclay.report.events import CompileEvents, GraphBreak, GraphEntry, GuardEntry, KernelEntry, Recompile
from fireclay_ir import Program

_LOCATION = re.compile(r"^  at (?P<file>.+?):(?P<line>\d+)(?:\n    (?P<text>.*))?", re.MULTILINE)


def describe_inputs(inputs: list[Any]) -> str:
    parts = []
    for x in inputs:
        if isinstance(x, torch.Tensor):
            dtype = str(x.dtype).removeprefix("torch.")
            parts.append(f"{dtype}[{', '.join(str(d) for d in x.shape)}]{' requires_grad' if x.requires_grad else ''}")
        else:
            parts.append(type(x).__name__)
    return "(" + ", ".join(parts) + ")"


def inspect_program(program: Program, example_inputs: list[Any], events: CompileEvents, label: str) -> None:
    """Run autograd -> loops -> kernel generation on ``program`` for the report; a stage that
    fails is noted and ends the walk (the compile itself is not affected)."""
    from fireclay_autograd import aot_graphs, trace_to_aten

    events.graphs.append(GraphEntry(f"{label}: captured", "capture", program))
    stage = "autograd"
    try:
        start = time.perf_counter()
        if any(isinstance(x, torch.Tensor) and x.requires_grad for x in example_inputs):
            pair = aot_graphs(program, example_inputs)
            aten_programs = [("aten forward", pair.forward), ("aten backward", pair.backward)]
        else:
            aten_programs = [("aten inference", trace_to_aten(program, example_inputs))]
        events.time("autograd", time.perf_counter() - start, label)
        for title, aten in aten_programs:
            events.graphs.append(GraphEntry(f"{label}: {title}", "autograd", aten))
        on_gpu = any(isinstance(x, torch.Tensor) and x.device.type == "cuda" for x in example_inputs)
        for title, aten in aten_programs:
            stage = "loops"
            import fireclay_loops

            start = time.perf_counter()
            scheduled = fireclay_loops.schedule(fireclay_loops.lower(aten))
            loops_program = fireclay_loops.to_program(scheduled)
            events.time("loops", time.perf_counter() - start, f"{label}: {title}")
            events.graphs.append(GraphEntry(f"{label}: {title} (loops)", "loops", loops_program))
            events.schedules.append((f"{label}: {title}", str(scheduled.report())))
            stage = "triton" if on_gpu else "cpp"
            start = time.perf_counter()
            kernels = _generate(scheduled, stage)
            events.time(stage, time.perf_counter() - start, f"{label}: {title} (source only, not built)")
            for k in kernels:
                events.kernels.append(KernelEntry(f"{label}: {title}", k.name, stage, k.source))
    except Exception as e:  # the report shows how far the stages got
        events.notes.append(f"{label}: the {stage} stage failed for the report: {type(e).__name__}: {e}")


def _generate(scheduled, language: str) -> list:
    if language == "triton":
        from fireclay_triton import generate_kernels

        return generate_kernels(scheduled)
    from fireclay_cpp import generate_kernels

    return generate_kernels(scheduled)


# The fields of a capture "tensor" guard, in the order fireclay-capture stores them.
_TENSOR_FIELDS = ("type", "dtype", "device", "shape", "stride", "requires_grad", "dynamic dims")


def guard_changes(before: Any, after: Any) -> list[str]:
    """What differs between the tensor guards of two cache entries, input by input: the reason
    the later entry was captured (``L['x'] shape (2, 3) -> (5, 3)``)."""
    def tensors(guards: Any) -> dict[str, tuple]:
        out = {}
        for g in getattr(guards, "guards", []):
            if g.kind == "tensor" and g.source is not None and isinstance(g.data, tuple):
                try:
                    where = g.source.expr({})
                except Exception:
                    where = str(g.source)
                out[where] = g.data
        return out

    old, new = tensors(before), tensors(after)
    changes = []
    for where in old.keys() & new.keys():
        for name, a, b in zip(_TENSOR_FIELDS, old[where], new[where]):
            if a != b and name != "dynamic dims":
                show = (lambda v: str(v).removeprefix("torch.")) if name == "dtype" else str
                changes.append(f"{where} {name} {show(a)} -> {show(b)}")
    return sorted(changes)


# Capture's own time per frame. fireclay-capture has no timing hook, so while a Recorder is alive
# each capture is timed around CapturedFunction._capture, less the backend time spent inside it
# (the recorded backends add theirs to _timing.backend).
_live_recorders: weakref.WeakSet[Recorder] = weakref.WeakSet()
_timing = threading.local()


def _install_capture_timer() -> None:
    from fireclay_capture.api import CapturedFunction

    original = CapturedFunction._capture
    if getattr(original, "_fireclay_report_timer", False):
        return

    @functools.wraps(original)
    def timed_capture(self: Any, *args: Any, **kwargs: Any) -> Any:
        if not _live_recorders or getattr(_timing, "depth", 0):  # nested: a retry on fake tensors
            return original(self, *args, **kwargs)
        _timing.depth, _timing.backend = 1, 0.0
        start = time.perf_counter()
        try:
            return original(self, *args, **kwargs)
        finally:
            seconds = time.perf_counter() - start - _timing.backend
            _timing.depth = 0
            name = getattr(getattr(self, "code", None), "co_qualname", "frame")
            for recorder in list(_live_recorders):
                recorder._events.time("capture", seconds, f"{name}: bytecode interpretation and guards")

    timed_capture._fireclay_report_timer = True  # type: ignore[attr-defined]
    CapturedFunction._capture = timed_capture


class Recorder:
    """Records what ``fireclay.compile`` does; ``recorder.events()`` gives the report's data."""

    def __init__(self, inspect_stages: bool = True, title: str = "fireclay compile report"):
        from fireclay.compile_cache import cache_stats

        self.inspect_stages = inspect_stages
        self._events = CompileEvents(title=title)
        self._compiled: list[tuple[str, Any, dict[int, str]]] = []  # (label, CapturedFunction, inputs by program)
        self._cache_at_start = cache_stats()
        _install_capture_timer()
        _live_recorders.add(self)

    def compile(self, model: Any = None, *, backend: Any = "fireclay", **kwargs: Any):
        """``fireclay.compile`` with recording; same arguments and result."""
        import fireclay.api

        if model is None:
            return lambda target: self.compile(target, backend=backend, **kwargs)
        label = getattr(model, "__qualname__", None) or type(model).__name__
        signatures: dict[int, str] = {}  # id(program) -> its example inputs, described
        # fireclay.api.compile, not fireclay.compile: inside recording() the latter is this method.
        result = fireclay.api.compile(model, backend=self._wrap(backend, label, signatures), **kwargs)
        captured = result._compiled if isinstance(result, fireclay.api.OptimizedModule) else result
        if captured is not model:  # disable=True hands the model back untouched
            self._compiled.append((label, captured, signatures))
        return result

    def _wrap(self, backend: Any, label: str, signatures: dict[int, str]) -> Callable[..., Any]:
        from fireclay.backends import lookup_backend

        real = lookup_backend(backend)
        name = backend if isinstance(backend, str) else getattr(backend, "__name__", "backend")
        try:
            takes_options = "options" in inspect.signature(real).parameters
        except (TypeError, ValueError):
            takes_options = False

        def recorded(program: Program, example_inputs: list, options: dict | None = None):
            index = len(signatures)
            signatures[id(program)] = describe_inputs(list(example_inputs))
            function = program.metadata.get("capture", {}).get("function", "")
            # Code after a graph break is captured as its own resume function, through this backend.
            shown = f"{label} → {function}" if function.startswith("resume") else label
            start = time.perf_counter()
            compiled = real(program, example_inputs, options=options) if takes_options else real(program, example_inputs)
            seconds = time.perf_counter() - start
            _timing.backend = getattr(_timing, "backend", 0.0) + seconds
            self._events.time(f"backend {name}", seconds, f"{shown} #{index}")
            if self.inspect_stages:
                inspect_program(program, list(example_inputs), self._events, f"{shown} #{index}")
            else:
                self._events.graphs.append(GraphEntry(f"{shown} #{index}: captured", "capture", program))
            return compiled

        if takes_options:
            return recorded
        # fireclay.compile hands options only to a backend whose signature names them.
        return lambda program, example_inputs: recorded(program, example_inputs)

    def events(self) -> CompileEvents:
        """The events so far, with guards, graph breaks and recompiles read from the caches."""
        ev = self._events
        ev.guards, ev.graph_breaks, ev.recompiles = [], [], []
        seen: set[int] = set()
        for label, captured, signatures in self._compiled:
            self._harvest(ev, label, captured, signatures, seen)
        ev.notes = [n for n in ev.notes if not n.startswith("graph breaks:")]
        if not _capture_splits_frames():
            ev.notes.append("graph breaks: this version of fireclay-capture runs a whole frame eagerly where it "
                            "cannot trace it; breaks that split a frame into several graphs are not recorded.")
        if not self._compiled:
            ev.not_recorded["guards"] = "no fireclay.compile call was recorded"
        ev.cache = _stats_since(self._cache_at_start)
        ev.time_notes = ["'capture' is the time spent capturing each frame: interpreting its bytecode and "
                         "building its guards (the backend's time excluded).",
                         "'backend NAME' is the time the chosen backend took to prepare each graph (some "
                         "backends compile lazily, at the first call)."]
        if self.inspect_stages:
            ev.time_notes.append("autograd, loops, cpp and triton times come from the report's own pass over "
                                 "each captured graph; kernels are generated as source, not built.")
        return ev

    def _harvest(self, ev: CompileEvents, label: str, captured: Any, signatures: dict, seen: set[int]) -> None:
        """One captured function's cache, then the resume functions its graph breaks made."""
        cache = getattr(captured, "cache", None)
        if cache is None or id(captured) in seen:
            return
        seen.add(id(captured))
        for i, entry in enumerate(cache.entries):
            ev.guards.append(GuardEntry(label, i, getattr(entry.guards, "source", str(entry.guards))))
            plan = getattr(entry, "graph_break", None)
            if plan is not None:
                loc = getattr(plan, "location", None) or {}
                ev.graph_breaks.append(GraphBreak(label, plan.reason, loc.get("file"), loc.get("line"),
                                                  loc.get("text") or None))
                for resume in getattr(plan, "resumes", {}).values():
                    name = getattr(getattr(resume, "code", None), "co_name", "resume")
                    self._harvest(ev, f"{label} → {name}", resume, signatures, seen)
            elif entry.compiled is None and entry.reason:
                m = _LOCATION.search(entry.reason)
                ev.graph_breaks.append(GraphBreak(label, entry.reason, m and m["file"], m and int(m["line"]),
                                                  m and m["text"]))
            if i > 0:
                inputs = signatures.get(id(entry.program), "a call")
                changed = guard_changes(cache.entries[i - 1].guards, entry.guards)
                why = "; ".join(changed) if changed else f"no earlier entry's guards accepted {inputs}"
                ev.recompiles.append(Recompile(label, i, f"{why} (inputs {inputs})"))


def _stats_since(before: dict[str, dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """The compile cache's counts since ``before`` (a ``cache_stats()`` snapshot)."""
    from fireclay.compile_cache import cache_stats

    now = cache_stats()
    return {stage: {k: v - before.get(stage, {}).get(k, 0) for k, v in counts.items()} for stage, counts in now.items()}


def _capture_splits_frames() -> bool:
    from fireclay_capture.cache import CacheEntry

    return "graph_break" in getattr(CacheEntry, "__dataclass_fields__", {})


@contextlib.contextmanager
def recording(inspect_stages: bool = True, title: str = "fireclay compile report") -> Iterator[Recorder]:
    """Inside the block, ``fireclay.compile`` records into the yielded :class:`Recorder`."""
    import fireclay

    recorder = Recorder(inspect_stages, title)
    previous = fireclay.compile
    fireclay.compile = recorder.compile
    try:
        yield recorder
    finally:
        fireclay.compile = previous
