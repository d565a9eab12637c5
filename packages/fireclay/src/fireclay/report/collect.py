"""Collecting a compile's events: record what a run's compiles really did, or run the stages
over a saved program for inspection.

:class:`Recorder` listens to the stages (``fireclay.stages``) while it records: every program
they make, every stage's own time and every generated source of the run, training included
(the forward and backward graphs, the backward compiled at the first backward call). Its
:meth:`Recorder.compile` wraps ``fireclay.compile`` so that the compiled callable's cache
(guards, graph breaks, recompiles) is read afterwards. ``recording()`` makes every
``fireclay.compile`` call made inside it go through a recorder (used by ``fireclay report
SCRIPT.py``).

:func:`inspect_program` takes one saved captured (torch-dialect) program through autograd ->
loops -> kernel generation, timing each stage and keeping every intermediate graph and generated
source. It generates kernel source without building it, so it works without a C++ compiler or a
GPU (``fireclay report FILE.fcir.json``).
"""

from __future__ import annotations

import contextlib
import inspect
import re
import time
import weakref
from collections.abc import Callable, Iterator
from typing import Any

import torch

from fireclay.report.events import (
    CompileEvents,
    GraphBreak,
    GraphEntry,
    GuardEntry,
    KernelEntry,
    Recompile,
    TimelineEntry,
)
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


# Recorders alive now; one stage listener hands each of them what the compiles really did.
_live_recorders: weakref.WeakSet[Recorder] = weakref.WeakSet()


def _dispatch(event: Any) -> None:
    recorders = list(_live_recorders)
    if not recorders:  # the last one was collected without stop(): stop listening
        from fireclay import stages

        stages.remove_listener(_dispatch)
    for recorder in recorders:
        recorder._on_stage_event(event)


_ORIGIN_NAMES = re.compile(r"%(\w+)")


def loops_modules(loops: Program, aten: Program) -> dict[int, str]:
    """The module of each node of a loops program (by position) whose kernel or extern call came
    from aten nodes that name one: their ``origins`` (``%v6 = aten::addmm.default``) name the aten
    values they compute."""
    made_in = {o.name: n.meta["module"] for n in aten.main.nodes if isinstance(n.meta.get("module"), str)
               for o in n.outputs}
    out: dict[int, str] = {}
    for position, node in enumerate(loops.main.nodes):
        # An extern call keeps its meta; a kernel's are on the bodies it runs (its "nodes").
        metas = [node.meta.get("loops.meta") or {}]
        for ref in node.kwargs.get("nodes") or ():
            body = loops.graphs.get(getattr(ref, "name", None))
            if body is not None:
                metas.append(body.meta.get("loops.meta") or {})
        origins = [o for meta in metas for o in meta.get("origins", []) if not o.startswith("(recomputed)")]
        found = [made_in[v] for o in origins for v in _ORIGIN_NAMES.findall(o.split(" = ")[0]) if v in made_in]
        if found:
            out[position] = found[0]
    return out


_LANGUAGES = {".cpp": "cpp", ".py": "python", ".c": "c", ".txt": "text"}


class Recorder:
    """Records what the compiles of a run really do; ``recorder.events()`` gives the report's data.

    While it records (from creation to :meth:`stop`), every graph compiled in the process, by
    ``fireclay.compile`` or ``torch.compile(backend="fireclay")``, shows its programs (captured,
    aten forward/backward/inference, loops), its generated code and each stage's own time, as the
    stages report them (``fireclay.stages`` listeners): a backward graph appears when the first
    backward call compiles it, a recompile when it happens. Functions compiled through
    :meth:`compile` also show their guards, graph breaks and recompiles (read from their caches)."""

    def __init__(self, title: str = "fireclay compile report"):
        from fireclay import stages
        from fireclay.compile_cache import cache_stats

        self._events = CompileEvents(title=title)
        self._compiled: list[tuple[str, Any, dict[int, str]]] = []  # (label, CapturedFunction, inputs by program)
        self._shown: set[int] = set()  # id() of the programs drawn
        self._aten: dict[tuple[int, str], Program] = {}  # (graph number, role) -> its aten program
        self._cache_at_start = cache_stats()
        self.started = time.perf_counter()
        stages.install()  # capture's start and end are stage events
        stages.add_listener(_dispatch)
        _live_recorders.add(self)

    def stop(self) -> None:
        """Stop recording (``recording()`` does it at the end of its block)."""
        from fireclay import stages

        _live_recorders.discard(self)
        if not _live_recorders:  # nobody listens: the stages skip what only a report shows
            stages.remove_listener(_dispatch)

    def _on_stage_event(self, event: Any) -> None:
        from fireclay import stages

        ev = self._events
        if isinstance(event, stages.StageTimed):
            ev.time(event.stage, event.seconds, event.label)
            ev.timeline.append(TimelineEntry(event.started - self.started, event.stage, event.label, event.seconds,
                                              event.ended - event.started))
        elif isinstance(event, stages.ProgramMade):
            self._shown.add(id(event.program))
            kind = event.kind
            stage = "capture" if kind == "captured" else kind.split()[0].replace("aten", "autograd")
            modules = None
            if kind.startswith("aten "):
                self._aten[(event.record.index, kind.split()[1])] = event.program
            elif kind.startswith("loops "):
                aten = self._aten.get((event.record.index, kind.split()[1]))
                modules = loops_modules(event.program, aten) if aten is not None else None
            ev.graphs.append(GraphEntry(f"{event.record.label}: {kind}", stage, event.program, modules=modules))
        elif isinstance(event, stages.CodeMade):
            files = getattr(event.compiled, "source_files", None)
            title = f"{event.record.label}: {event.kind}"
            for name, text in (files() if files is not None else {}).items():
                if name == "schedule.txt":
                    ev.schedules.append((title, text))
                else:
                    language = event.language if name.startswith("kernel") else \
                        _LANGUAGES.get(name[name.rfind("."):], "text")
                    ev.kernels.append(KernelEntry(title, name, language, text))

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
        from fireclay import stages
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
            # A stage of its own, so that capture's time leaves out the backend's.
            with stages.stage(f"backend {name}", f"{shown} #{index}"):
                compiled = real(program, example_inputs, options=options) if takes_options \
                    else real(program, example_inputs)
            if id(program) not in self._shown:  # a backend that tells no stage listener (eager, yours)
                self._shown.add(id(program))
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
        ev.time_notes = [
            "Each stage's own time in this run, as it ran (stages nested in it left out): 'capture' interprets "
            "a frame's bytecode and builds its guards; 'autograd' traces to aten and partitions (at the first "
            "call); 'loops' and 'cpp'/'triton' run per aten graph, a backward graph's at the first backward "
            "call; 'backend NAME' is the rest of the chosen backend's preparation.",
            "Not counted: running the compiled code and the eager parts of the script."]
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
def recording(title: str = "fireclay compile report") -> Iterator[Recorder]:
    """Inside the block, ``fireclay.compile`` records into the yielded :class:`Recorder`, and
    every compile of the process (``torch.compile(backend="fireclay")`` too) shows its stages."""
    import fireclay

    recorder = Recorder(title)
    previous = fireclay.compile
    fireclay.compile = recorder.compile
    try:
        yield recorder
    finally:
        fireclay.compile = previous
        recorder.stop()
