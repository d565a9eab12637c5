"""The fallback contract: a failure inside fireclay never reaches the caller unless ``fullgraph``.

Two places recover, each for what it owns:

- a captured graph (``guarded_backend``): when the backend fails to compile it, returns something
  that is not a callable, or its callable raises (the autograd stages trace, functionalize and
  partition at the first call; the runtime plan runs at every call), the graph runs in
  fireclay-ir's interpreter, op by op with eager semantics;
- an aten graph inside the ``fireclay`` backend (``guarded_codegen``): when lowering or code
  generation fails, or the generated code raises, that graph runs in the aten executor.

Either way one warning per place in the user's code (``fireclay_ir.stages.warn_fallback``) says
which stage failed, why, and where. A call that fails is run again the other way before anything
is decided: if that raises too, the error is the user's (as eager raises it) and it propagates
as eager's. Under ``fullgraph=True`` an internal failure raises :class:`BackendCompilerFailed`.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from fireclay_ir import InterpreterError, Program, interpret
from fireclay_ir.stages import describe, stage_of, tag, warn_fallback

log = logging.getLogger("fireclay")


class BackendCompilerFailed(RuntimeError):
    """A stage of fireclay failed on a captured graph, under ``fullgraph=True`` (otherwise the
    graph runs in the interpreter and a warning says why). ``stage`` names the stage."""

    def __init__(self, message: str, stage: str = "backend"):
        super().__init__(message)
        self.stage = stage


def first_source(program: Program) -> str:
    """``file:line`` of the first node that knows where it came from."""
    for node in program.main.nodes:
        src = node.meta.get("source")
        if src:
            return f"{src.get('file')}:{src.get('line')}"
    return "an unknown location"


def captured_from(program: Program) -> tuple[str, str]:
    """(the place, as ``file:line``, of the captured function; its name) for messages: the
    function's first line as capture recorded it, else the first node's source."""
    capture = program.metadata.get("capture") if isinstance(program.metadata, dict) else None
    if isinstance(capture, dict) and capture.get("file"):
        return f"{capture['file']}:{capture.get('line')}", str(capture.get("function", "?"))
    return first_source(program), "?"


def _message(stage: str, exc: BaseException, program: Program, backend: str, then: str) -> str:
    place, function = captured_from(program)
    return (f"fireclay: {stage} failed on the graph captured from {function} ({place}; its first operation "
            f"at {first_source(program)}), backend {backend!r}: {describe(exc)}. {then}")


class BackendReturnedNothing(TypeError):
    """A backend returned something other than a callable (None, most often)."""


def guarded_backend(backend: Callable[..., Any], name: str, fullgraph: bool) -> Callable[..., Any]:
    """Wrap a capture backend so that its failures, at compile time or at a call, run the graph
    in fireclay-ir's interpreter with one warning (or raise under ``fullgraph``)."""

    def compile_guarded(program: Program, example_inputs: list) -> Callable[..., Any]:
        try:
            compiled = backend(program, example_inputs)
            if not callable(compiled):
                raise BackendReturnedNothing(f"backend {name!r} returned {compiled!r}, not a callable "
                                             "(a backend must return the function that runs the graph)")
        except Exception as exc:
            stage = stage_of(exc)
            if fullgraph:
                raise BackendCompilerFailed(_failed_under_fullgraph(stage, exc, program, name), stage) from exc
            warn_fallback(log, captured_from(program)[0], stage, _message(
                stage, exc, program, name, "That graph runs in the interpreter instead (eager semantics); "
                "fullgraph=True makes this an error."))
            return InterpretedGraph(program)
        return GuardedGraph(compiled, program, name, fullgraph)

    return compile_guarded


def _failed_under_fullgraph(stage: str, exc: BaseException, program: Program, name: str) -> str:
    place, function = captured_from(program)
    return (f"backend {name!r} failed in {stage} on the graph captured from {function} ({place}), first "
            f"operation at {first_source(program)}: {describe(exc)}")


def run_as_eager(program: Program, inputs: tuple) -> Any:
    """The graph run by the interpreter; an error of the user's code raises as eager raises it
    (the interpreter wraps it to name the node: the original is raised instead)."""
    try:
        return interpret(program, *inputs)
    except InterpreterError as wrapped:
        cause = wrapped.__cause__
        if isinstance(cause, Exception):
            raise cause.with_traceback(cause.__traceback__) from None
        raise


class InterpretedGraph:
    """A captured graph run by fireclay-ir's interpreter."""

    def __init__(self, program: Program):
        self.program = program

    def __call__(self, *inputs: Any) -> Any:
        return interpret(self.program, *inputs)


class GuardedGraph:
    """A backend's callable for one captured graph. A call that raises runs again in the
    interpreter: an error there too is the user's and propagates; otherwise the failure was
    fireclay's, it is reported, and the graph stays in the interpreter from then on."""

    def __init__(self, compiled: Callable[..., Any], program: Program, backend: str, fullgraph: bool):
        self.compiled = compiled
        self.program = program
        self.backend = backend
        self.fullgraph = fullgraph
        self.failed = False

    def __call__(self, *inputs: Any) -> Any:
        if self.failed:
            return interpret(self.program, *inputs)
        try:
            return self.compiled(*inputs)
        except Exception as exc:
            return self._recover(exc, inputs)

    def _recover(self, exc: Exception, inputs: tuple) -> Any:
        result = run_as_eager(self.program, inputs)  # raises the user's own error, as eager would
        stage = stage_of(exc)
        if self.fullgraph:
            raise BackendCompilerFailed(_failed_under_fullgraph(stage, exc, self.program, self.backend),
                                        stage) from exc
        self.failed = True
        warn_fallback(log, captured_from(self.program)[0], stage, _message(
            stage, exc, self.program, self.backend, "That graph runs in the interpreter from now on (eager "
            "semantics); fullgraph=True makes this an error."))
        return result

    def __getattr__(self, name: str) -> Any:  # what the backend's callable offers (settled(), ...)
        return getattr(self.__dict__["compiled"], name)


class GuardedAtenGraph:
    """A compiled aten graph whose call, if it raises, runs again in ``fallback`` (the aten
    executor); see :class:`GuardedGraph`."""

    def __init__(self, compiled: Callable[..., Any], fallback: Callable[..., Any], program: Program,
                 fullgraph: bool, label: str | None = None):
        self.compiled = compiled
        self.fallback = fallback
        self.program = program
        self.fullgraph = fullgraph
        self.failed = False
        # The graph's label while its first call has not run: that call is timed as the stage
        # "first run" (loading and first execution of the generated code).
        self.first_call_label = label

    def __call__(self, *inputs: Any) -> Any:
        if self.failed:
            return self.fallback(*inputs)
        if self.first_call_label is not None:
            from fireclay import stages

            label, self.first_call_label = self.first_call_label, None
            with stages.stage("first run", label):
                return self(*inputs)
        try:
            return self.compiled(*inputs)
        except Exception as exc:
            result = self.fallback(*inputs)  # the user's own error raises here, as in eager
            if self.fullgraph:
                raise tag(exc, stage_of(exc, "generated code")) from None
            self.failed = True
            stage = stage_of(exc, "generated code")
            warn_fallback(log, captured_from(self.program)[0], stage, _aten_message(stage, exc, self.program,
                                                                                     "from now on"))
            return result

    def __getattr__(self, name: str) -> Any:
        return getattr(self.__dict__["compiled"], name)


def _aten_message(stage: str, exc: BaseException, program: Program, when: str) -> str:
    place, function = captured_from(program)
    return (f"fireclay: {stage} failed for an aten graph of {function} ({place}; its first operation at "
            f"{first_source(program)}): {describe(exc)}. That graph runs in the aten interpreter {when} "
            "(correct, slower); fullgraph=True makes this an error.")


def guarded_codegen(compile_graph: Callable[[], Callable[..., Any]], interpreter: Callable[[], Callable[..., Any]],
                    program: Program, fullgraph: bool, label: str | None = None) -> Callable[..., Any]:
    """``compile_graph()`` for one aten graph, or ``interpreter()`` when it fails (with one
    warning; under ``fullgraph`` the failure propagates, tagged with its stage). ``label`` names
    the graph in the stage times of its first call."""
    try:
        compiled = compile_graph()
    except Exception as exc:
        if fullgraph:
            raise tag(exc, "code generation") from None
        stage = stage_of(exc, "code generation")
        warn_fallback(log, captured_from(program)[0], stage, _aten_message(stage, exc, program, "instead"))
        return interpreter()
    return GuardedAtenGraph(compiled, interpreter(), program, fullgraph, label)
