"""``capture(fn_or_module)``: the entry point. A captured callable binds its arguments, checks
the guards of its cache entries, and runs the first entry that matches; on a miss it traces the
function's bytecode again (up to the recompile limit)."""

from __future__ import annotations

import contextlib
import functools
import gc
import logging
import sys
import types
import warnings
from collections.abc import Callable, Iterator
from typing import Any

import torch

from fireclay_capture.backends import lookup_backend
from fireclay_capture.binding import argument_binder
from fireclay_capture.cache import CacheEntry, CaptureStats, CodeCache
from fireclay_capture.code_flags import CO_VARARGS, CO_VARKEYWORDS, suspends
from fireclay_capture.config import config
from fireclay_capture.controls import CaptureWrapper
from fireclay_capture.eager_calls import CallHooks, calling_through
from fireclay_capture.errors import (
    CaptureError,
    NeedsFakeTensors,
    ObservedException,
    Unsupported,
    format_location,
)
from fireclay_capture.graph_break import plan_break
from fireclay_capture.interpreter import Frame
from fireclay_capture.outputs import output_spec, replay_of
from fireclay_capture.resume import cell_parameters, resume_function_for
from fireclay_capture.sources import ConstSource, LocalSource, read_source
from fireclay_capture.tracer import Tracer
from fireclay_capture.variables.builder import wrap
from fireclay_capture.variables.functions import is_generator_context_factory
from fireclay_capture.variables.objects import _hooks_of
from fireclay_ir.stages import describe, tag, warn_fallback

log = logging.getLogger("fireclay_capture")
# Channels a user turns on one by one (FIRECLAY_LOG=recompiles,graph_breaks,guards under fireclay).
recompiles_log = logging.getLogger("fireclay_capture.recompiles")
graph_breaks_log = logging.getLogger("fireclay_capture.graph_breaks")
guards_log = logging.getLogger("fireclay_capture.guards")


# Callables told when a frame's capture starts and ends: listener(event, captured_function,
# seconds) with event "start" (seconds 0) or "end" (the capture's time, its backend's included).
# The umbrella shows progress and stage times with them; see add_capture_listener.
_capture_listeners: list = []


def add_capture_listener(listener) -> None:
    """Call ``listener(event, captured_function, seconds)`` around every capture ("start"/"end")."""
    if listener not in _capture_listeners:
        _capture_listeners.append(listener)


def remove_capture_listener(listener) -> None:
    if listener in _capture_listeners:
        _capture_listeners.remove(listener)


class RecompileError(RuntimeError):
    """A compiled function needed a new capture under ``set_stance("fail_on_recompile")``."""


@contextlib.contextmanager
def _collector_paused() -> Iterator[None]:
    """Automatic garbage collection off for the block (see ``config.pause_gc``); a no-op when
    it is already off (nested captures: resume functions captured during a first call)."""
    if not config.pause_gc or not gc.isenabled():
        yield
        return
    gc.disable()
    try:
        yield
    finally:
        gc.enable()


def capture(fn_or_module=None, *, backend="eager", fullgraph: bool = False, dynamic: bool | None = None):
    """Capture a function or ``nn.Module`` into fireclay-ir graphs and run them via ``backend``.

    Usable as ``capture(fn)``, ``capture(module)``, ``@capture`` or ``@capture(backend=...)``.
    ``fullgraph=True`` turns anything the capture cannot trace into a :class:`CaptureError`
    naming the user's file and line; otherwise such a frame runs eagerly.
    """
    if fn_or_module is None:
        return lambda target: CapturedFunction(target, backend, fullgraph, dynamic)
    return CapturedFunction(fn_or_module, backend, fullgraph, dynamic)


class CapturedFunction(CaptureWrapper):
    def __init__(self, target: Any, backend, fullgraph: bool, dynamic: bool | None):
        self.module: torch.nn.Module | None = None
        self.fn: Any  # the Python function that runs: a module's forward, a method's function
        self._bound_self: Any = None
        self._target = target
        if isinstance(target, torch.nn.Module):
            self.module = target
            forward = target.forward
            self.fn = forward.__func__ if isinstance(forward, types.MethodType) else forward
            self._bound_self = target if isinstance(forward, types.MethodType) else None
        elif isinstance(target, types.MethodType):
            self.fn = target.__func__
            self._bound_self = target.__self__
        elif isinstance(target, types.FunctionType):
            self.fn = target
        else:
            raise TypeError(f"capture() takes a Python function or an nn.Module, got {type(target).__name__}")
        self.dynamic = dynamic
        # (source -> dims) found to change between calls: traced symbolic from then on.
        self._auto_dynamic: dict = {}
        self.backend = lookup_backend(backend)
        self.fullgraph = fullgraph
        self.code = self.fn.__code__
        self.cache = CodeCache()
        self.stats = CaptureStats()
        self.programs: list = []
        self._bind_arguments = argument_binder(self.fn)
        # Positional parameters only: a call with exactly that many positional arguments binds
        # by position (the common case, without the binder).
        self._names = list(self.code.co_varnames[:self.code.co_argcount])
        self._simple = not self.code.co_kwonlyargcount and not self.code.co_flags & (CO_VARARGS | CO_VARKEYWORDS)
        # Functions this one reaches after its graph breaks, each captured on its own: resume
        # functions by (offset, stack layout) under their BreakPlan, callees by function.
        self._callees: dict = {}
        # Callees captured per code object (shared with _callees): a function or module made anew
        # on every call (a closure defined in forward) would otherwise be captured on every call.
        self._callee_codes: dict[types.CodeType, int] = {}
        self.children: list[CapturedFunction] = []
        # A function or module captured on its own is its own callee: a frame that runs eagerly
        # and calls it again (recursion) reaches this capture, not a second one.
        if isinstance(target, (types.FunctionType, torch.nn.Module)):
            self._callees[target] = self
        self._calling_through: Any = None  # self.fn with its callees captured, once built
        # Set on callees captured on their own: a trace with no graph node runs eagerly instead.
        self.empty_runs_eagerly = False
        functools.update_wrapper(self, self.fn, updated=())

    # -- calling
    @property
    def captured_target(self) -> Any:
        return self._target

    def _bind(self, args: tuple, kwargs: dict) -> dict:
        if self._bound_self is not None:
            args = (self._bound_self, *args)
        if self._simple and not kwargs and len(args) == len(self._names):
            return dict(zip(self._names, args))
        return self._bind_arguments(args, kwargs)

    def __call__(self, *args, **kwargs):
        self.stats.calls += 1
        if self.module is not None and _hooks_of(self.module):
            # Hooks run around forward: call the module as is (its forward is not captured).
            self.stats.fallbacks += 1
            warn_fallback(log, _code_place(self.code), "module hooks",
                          f"running eagerly: {type(self.module).__name__}.forward ({_code_place(self.code)}) is not "
                          "captured because the module has forward hooks or pre-hooks; remove them or compile "
                          "the module's forward without hooks")
            return self.module(*args, **kwargs)
        return self._run(self._bind(args, kwargs), lambda fn: fn(*self._call_args(args), **kwargs))

    def call_with_list(self, values: list) -> Any:
        """Call with the positional arguments handed over in ``values``, which is emptied: the
        caller keeps no reference to them (a resume function may drop a dead argument early)."""
        if self._bound_self is not None or not self._simple or len(values) != len(self._names):
            args = tuple(values)
            values.clear()
            return self(*args)
        self.stats.calls += 1
        L = dict(zip(self._names, values))
        values.clear()
        return self._run(L, lambda fn: fn(*L.values()))

    def _run(self, L: dict, run_eagerly) -> Any:
        if config.stance == "force_eager":
            return run_eagerly(self.fn)
        hit = self.cache.lookup(L)
        if hit is not None:
            entry, inputs = hit
            del hit
            self.stats.cache_hits += 1
            if entry.compiled is None:  # the capture gave up: eager, its callees captured
                return run_eagerly(self._eager_function())
            return entry.run(inputs, L)
        if self.cache.given_up:
            return run_eagerly(self._eager_function())
        if self.cache.entries and (config.stance != "default" or recompiles_log.isEnabledFor(logging.INFO)):
            reason = self.recompile_reason(L)
            if config.stance == "eager_on_recompile":
                return run_eagerly(self.fn)
            if config.stance == "fail_on_recompile":
                raise RecompileError(f"{self._where()} would be captured again under set_stance('fail_on_recompile'): "
                                     f"{reason}")
            recompiles_log.info("recompiling %s: %s", self._where(), reason)
        if len(self.cache.entries) >= config.recompile_limit:
            warnings.warn(f"fireclay_capture: {self.code.co_qualname} ({self.code.co_filename}:"
                          f"{self.code.co_firstlineno}) was re-captured {config.recompile_limit} times "
                          "(config.recompile_limit); running it eagerly from now on", stacklevel=3)
            self.cache.given_up = True
            return run_eagerly(self._eager_function())
        if self.cache.entries and self.dynamic is None and config.automatic_dynamic:
            self._note_changed_sizes(L)
        with _collector_paused():
            if _capture_listeners:
                entry = self._capture_told(L)
            else:
                entry = self._capture(L)
            self.cache.entries.append(entry)
            if entry.compiled is not None:
                fresh_inputs = entry.guards(L)
                if fresh_inputs is None:  # pragma: no cover - a trace must accept the call it was made from
                    raise AssertionError(f"fresh guards rejected their own inputs:\n{entry.guards.source}")
                # The first call compiles the program (backends compile lazily), so it runs paused too.
                return entry.run(fresh_inputs, L)
        return run_eagerly(self._eager_function())

    def _eager_function(self) -> Any:
        """The function as it runs when its capture gave up: its own code, with the functions
        and modules it calls captured on their own (as TorchDynamo's frame hook stays on for
        the callees of a frame it skips); the plain function where the code is not rewritten."""
        if self._calling_through is None:
            self._calling_through = calling_through(self.fn, CallHooks(callee=self.callee)) or self.fn
        return self._calling_through

    def _capture_told(self, L: dict) -> CacheEntry:
        import time

        for listener in list(_capture_listeners):
            listener("start", self, 0.0)
        start = time.perf_counter()
        try:
            return self._capture(L)
        finally:
            for listener in list(_capture_listeners):
                listener("end", self, time.perf_counter() - start)

    def _where(self) -> str:
        return f"{self.code.co_qualname} ({self.code.co_filename}:{self.code.co_firstlineno})"

    def recompile_reason(self, L: dict) -> str:
        """Why no cache entry accepts ``L``: the first failing guard of each entry, newest first."""
        reasons = []
        for i in range(len(self.cache.entries) - 1, -1, -1):
            why = self.cache.entries[i].guards.first_failure(L)
            reasons.append(f"entry {i}: {why or 'no guard failed'}")
        return "; ".join(reasons[:3]) + (f"; and {len(reasons) - 3} older entries" if len(reasons) > 3 else "")

    def _note_changed_sizes(self, L: dict) -> None:
        """Automatic dynamic: dims whose size differs from the last capture become symbolic."""
        last = self.cache.entries[-1].guards.guards
        for g in last:
            if g.kind != "tensor" or g.source is None:
                continue
            try:
                t = read_source(g.source, L)
            except Exception:
                continue
            shape = g.data[3]
            if isinstance(t, torch.Tensor) and t.dim() == len(shape) and t.dtype is g.data[1]:
                changed = {d for d, (a, b) in enumerate(zip(t.shape, shape)) if a != b}
                if changed:
                    self._auto_dynamic.setdefault(g.source, set()).update(changed)

    def _call_args(self, args: tuple) -> tuple:
        return (self._bound_self, *args) if self._bound_self is not None else args

    # -- capturing
    def _capture(self, L: dict, on_fakes: bool = False) -> CacheEntry:
        tx = Tracer(root_module=self.module, dynamic_dims=self._auto_dynamic, dynamic_all=bool(self.dynamic),
                    on_fakes=on_fakes)
        prior_grad = torch.is_grad_enabled()
        try:
            cell_params = cell_parameters(self.code)
            local_vars = {name: wrap(tx, value, LocalSource(name)) for name, value in L.items()
                          if name not in cell_params}
            if self.code.co_flags & CO_VARKEYWORDS:  # **kwargs is a new dict on every call
                varkw = self.code.co_varnames[self.code.co_argcount + self.code.co_kwonlyargcount
                                              + bool(self.code.co_flags & CO_VARARGS)]
                local_vars[varkw].fresh = True
            cells = {name: tx.cell_var(cell, ConstSource(cell, "cell"))
                     for name, cell in zip(self.code.co_freevars, self.fn.__closure__ or ())}
            for name in cell_params:  # a resume function gets its frame's cells themselves
                if not isinstance(L[name], types.CellType):
                    raise Unsupported(f"resume parameter {name!r} is not a cell")
                cells[name] = tx.cell_var(L[name], LocalSource(name))
            frame = Frame(tx, self.code, self.fn.__globals__, local_vars, cells)
            result = frame.run()
            memo: dict = {}
            spec = output_spec(tx.graph, result, tx.shapes, memo)
            replay = replay_of(tx.side_effects, lambda v: output_spec(tx.graph, v, tx.shapes, memo))
            program = tx.program()
            plan = None
        except NeedsFakeTensors:
            self._leave_contexts(tx, prior_grad)
            if on_fakes:  # pragma: no cover - fake tensors never ask for themselves
                raise
            return self._capture(L, on_fakes=True)
        except Unsupported as e:
            if isinstance(e, ObservedException) and e.certain and not e.reason.startswith(USER_RAISED):
                e.reason = f"{USER_RAISED} {e.reason}"  # the user's exception, not the capture's fault
            if e.location is None and tx.frames == [] and "frame" in locals():
                e.location = tx.location(frame)  # failed on the return value
            plan = None
            if not self.fullgraph and "frame" in locals() and config.graph_breaks:
                try:
                    plan = plan_break(tx, frame, e)
                    replay = None  # the plan replays the changes made before the break
                    program = tx.program()
                    spec = None
                except Exception as why:  # Unsupported, or a fault of the break machinery
                    plan = None
                    e.reason = f"{e.reason} (and no graph break: {getattr(why, 'reason', why)})"
            if plan is None:
                self._leave_contexts(tx, prior_grad)
                return self._fallback(tx, e)
            log.info("graph break in %s: %s", self.code.co_qualname,
                     describe_unsupported(self.code, e).splitlines()[0])
            if graph_breaks_log.isEnabledFor(logging.INFO):
                graph_breaks_log.info("graph break in %s at %s: %s", self.code.co_qualname,
                                      format_location(e.location), e.reason)
        except Exception as exc:  # a fault inside the capture: never the user's problem
            if self.fullgraph:
                raise tag(exc, "capture") from None
            self._leave_contexts(tx, prior_grad)
            failure = Unsupported(f"the capture failed with an internal error ({describe(exc)})")
            failure.location = getattr(exc, "capture_location", None)
            return self._fallback(tx, failure, stage="capture failed")
        finally:
            torch.set_grad_enabled(prior_grad)
        if self.empty_runs_eagerly and plan is None and not program.graphs[program.entry].nodes:
            # A callee with no tensor work (transformers' is_torchdynamo_compiling()) runs as it
            # is: a capture would fold compile-time answers into what eager code reads (TorchDynamo
            # skips such frames too). Not a fallback: nothing was left uncompiled.
            self._leave_contexts(tx, prior_grad)
            return CacheEntry(tx.guards.compile([]), None, None, None)
        if tx.shapes is not None:
            tx.guards.expression(tx.shapes.guard_text())
        program.metadata["capture"] = {"function": self.code.co_qualname, "file": self.code.co_filename,
                                       "line": self.code.co_firstlineno}
        tx.aliases.guard_distinct()
        guards = tx.guards.compile(tx.input_sources, L)
        if guards_log.isEnabledFor(logging.INFO):
            guards_log.info("guards of %s, entry %d (%d guards):\n%s", self._where(), len(self.cache.entries),
                            len(guards.guards), guards.source.rstrip())
        compiled = _returned_inputs(program.graphs[program.entry]) or self.backend(program, list(tx.example_inputs))
        if self.stats.captures or self.stats.fallbacks:
            self.stats.recompiles += 1
        self.stats.captures += 1
        self.programs.append(program)
        return CacheEntry(guards, compiled, spec, program, replay=replay, graph_break=plan,
                          owner=self if plan is not None else None)

    @staticmethod
    def _leave_contexts(tx: Tracer, prior_grad: bool) -> None:
        for ctx in reversed(tx.entered_contexts):
            ctx.__exit__(None, None, None)
        tx.entered_contexts.clear()
        torch.set_grad_enabled(prior_grad)

    def _fallback(self, tx: Tracer, e: Unsupported, stage: str = "unsupported code") -> CacheEntry:
        if self.fullgraph:
            raise CaptureError(describe_unsupported(self.code, e)) from None
        if e.location is None:  # at least the function's own first line
            e.location = {"file": self.code.co_filename, "line": self.code.co_firstlineno, "text": ""}
        if e.reason.startswith(USER_RAISED):
            stage = "user code raised"
        message = describe_unsupported(self.code, e, RUNS_EAGERLY)
        # Never silent: the first time for this code object at WARNING, later at INFO.
        warn_fallback(log, _code_place(self.code), stage, f"running eagerly: {message}")
        self.stats.fallbacks += 1
        # The guards gathered before the failure say when another trace could go differently.
        return CacheEntry(tx.guards.compile([]), None, None, None, reason=message)

    # -- after a graph break
    def callee(self, fn: Any) -> Any:
        """``fn`` as the break's call runs it: a user function, or a module whose forward is user
        code, is captured on its own (as TorchDynamo's frame hook stays on for the frames a
        graph break or a skipped frame calls). One captured callee per function or module for
        the whole tree of functions a capture leads to, so nothing is captured twice."""
        if isinstance(fn, torch.nn.Module):
            return self._module_callee(fn)
        func = fn.__func__ if isinstance(fn, types.MethodType) else fn
        if not isinstance(func, types.FunctionType) or getattr(func, "_fireclay_eager", False):
            return fn
        if suspends(func.__code__) or is_generator_context_factory(func):  # run as they are
            return fn
        if not _plain_parameters(func.__code__):  # a comprehension's code (its ".0" iterator)
            return fn
        if _is_library(getattr(func, "__module__", None) or ""):
            return fn
        captured = self._callees.get(func)
        if captured is None:
            if not self._may_capture_another(func.__code__):
                return fn
            captured = self._callees[func] = self._child(func)
            captured.empty_runs_eagerly = True
        return functools.partial(captured, fn.__self__) if fn is not func else captured

    def _module_callee(self, module: torch.nn.Module) -> Any:
        forward = getattr(type(module), "forward", None)
        if not isinstance(forward, types.FunctionType) or getattr(forward, "_fireclay_eager", False) \
                or (_is_library(forward.__module__ or "") and not _is_torch_container(module)) \
                or suspends(forward.__code__) or "forward" in vars(module):
            return module  # torch's own layers (an LSTM breaks inside), or a forward set on the instance
        if _hooks_of(module):
            return module  # hooks run around forward (FSDP2's gathers): called as it is, as before the break
        captured = self._callees.get(module)
        if captured is None:
            if not self._may_capture_another(forward.__code__):
                return module
            captured = self._callees[module] = self._child(module)
            captured.empty_runs_eagerly = True
        return captured

    def _may_capture_another(self, code: types.CodeType) -> bool:
        """Whether one more function or module running ``code`` is captured on its own: up to the
        recompile limit per code object, as TorchDynamo's cache per code. Past it (a closure or a
        module made anew on every call), new ones run as they are, with a warning."""
        captured = self._callee_codes.get(code, 0)
        if captured >= config.recompile_limit:
            warn_fallback(log, _code_place(code), "made anew",
                          f"running eagerly: {_code_place(code)} was captured for {captured} different function or "
                          "module objects (one is made on every call); new ones run as they are. Define the "
                          "function or module once, outside the function called on every step, to have it compiled")
            return False
        self._callee_codes[code] = captured + 1
        return True

    def _child(self, target: Any) -> CapturedFunction:
        captured = CapturedFunction(target, self.backend, False, self.dynamic)
        captured._callees = self._callees  # one registry for the whole tree
        captured._callee_codes = self._callee_codes
        self.children.append(captured)
        return captured

    def resume_function(self, plan, offset: int, layout: tuple[str, ...]) -> CapturedFunction:
        key = (offset, layout)
        captured = plan.resumes.get(key)
        if captured is None:
            fn = resume_function_for(self.fn, offset, layout, plan.local_names)
            captured = plan.resumes[key] = self._child(fn)
        return captured

    def graph_count(self) -> int:
        """Graphs captured by this function and by everything its graph breaks led to."""
        return sum(1 for p in self.programs if p.graphs[p.entry].nodes) + sum(c.graph_count() for c in self.children)

    def break_count(self) -> int:
        return (sum(1 for e in self.cache.entries if e.graph_break is not None)
                + sum(c.break_count() for c in self.children))

    @property
    def last_program(self):
        return self.programs[-1] if self.programs else None


# Code that runs as it is after a break (TorchDynamo skips these too); the modelling libraries
# built on torch (transformers) are user code to capture.
_LIBRARIES = frozenset({"torch", "numpy", "fireclay_capture", "fireclay_ir", "fireclay_shapes", "fireclay",
                        "contextlib", "logging", "warnings"})


def _plain_parameters(code: types.CodeType) -> bool:
    n = code.co_argcount + code.co_kwonlyargcount + bool(code.co_flags & CO_VARARGS) \
        + bool(code.co_flags & CO_VARKEYWORDS)
    return all(name.isidentifier() for name in code.co_varnames[:n])


def _returned_inputs(graph: Any) -> Callable[..., tuple] | None:
    """For a graph without nodes that returns some of its inputs (the part of a function after its
    last break that only passes a result on; a wrapper's resume function), the callable that hands
    those inputs back, the very objects eager returns: no backend compiles it, as TorchDynamo calls
    none for a graph without calls. None for any other graph."""
    if graph.nodes:
        return None
    positions = {id(v): i for i, v in enumerate(graph.inputs)}
    if not all(id(o) in positions for o in graph.outputs):
        return None
    picks = [positions[id(o)] for o in graph.outputs]
    return lambda *inputs: tuple(inputs[i] for i in picks)


def _is_torch_container(module: torch.nn.Module) -> bool:
    """``nn.Sequential`` (the layout of torchvision's models: stages of user blocks): captured like
    user code after a break, so that the user's blocks it calls are captured too, as TorchDynamo's
    frame hook stays on inside it. torch.nn's other modules run as they are: their eager fast
    paths (``MultiheadAttention``'s native kernel) probe dispatch state a graph cannot hold."""
    return getattr(type(module), "forward", None) is torch.nn.Sequential.forward


def _is_library(module_name: str) -> bool:
    """Code that runs as it is when a break or an eager frame calls it: torch, fireclay and
    Python's standard library (``copy``, ``functools``...), as TorchDynamo skips them too."""
    top = module_name.split(".")[0]
    return top in _LIBRARIES or top in sys.stdlib_module_names


def _code_place(code: types.CodeType) -> str:
    return f"{code.co_qualname} ({code.co_filename}:{code.co_firstlineno})"


# How the reason of a stop starts when the traced code itself raised (an uncaught exception of the
# user's code while tracing it: eager raises it too, or took another path where the library's
# compile-only code raised it).
USER_RAISED = "the traced code raised"

# What happens to a function the capture stopped in, said after the reason.
SPLIT_OR_EAGER = ("Without fullgraph=True the function is split at this line (the graph before it is compiled, the "
                  "line runs in Python, the rest is captured again), or runs eagerly where it cannot be split; to "
                  "keep one graph, rewrite the line above or move it out of the captured function.")
RUNS_EAGERLY = ("The function runs eagerly (fullgraph=True makes this an error); rewrite the line above or move it "
                "out of the captured function to have it compiled.")


def describe_unsupported(code: types.CodeType, e: Unsupported, then: str = SPLIT_OR_EAGER) -> str:
    lines = [f"fireclay_capture could not capture {code.co_qualname}: {e.reason}",
             f"  at {format_location(e.location)}"]
    for outer in reversed(e.stack):
        lines.append(f"  called from {format_location(outer)}")
    lines.append(then)
    return "\n".join(lines)
