"""Errors: ``Unsupported`` stops a trace (internal), ``CaptureError`` is what users see."""

from __future__ import annotations

from typing import Any


class Unsupported(Exception):
    """The symbolic interpreter met something it cannot trace.

    Raised inside the interpreter; the capture driver turns it into an eager fallback or, under
    ``fullgraph=True``, into a :class:`CaptureError` that names the user's code. The frame stack
    at the point of failure stays inspectable (``frames``) so that graph breaks can resume there.
    """

    def __init__(self, reason: str):
        super().__init__(reason)
        self.reason = reason
        self.location: dict | None = None  # {"file", "line", "text"} of the user's code
        self.stack: list[dict] = []  # outer call sites, outermost first
        self.frame: Any = None  # the innermost interpreter Frame, stopped at the failing instruction


class NeedsFakeTensors(Unsupported):
    """The trace met something (autocast) that plain meta fakes cannot model: start again with
    fireclay-shapes' fake tensors."""


class CaptureError(RuntimeError):
    """Capturing the user's function failed where a whole graph was required (``fullgraph=True``),
    or the trace itself found a mistake in the user's code."""


class ObservedException(Unsupported):
    """The traced code raised a Python exception the interpreter could model (an AttributeError
    during ``getattr(obj, name, default)`` or ``hasattr``); callers that know the protocol catch
    it, everyone else sees it as unsupported. A ``try`` block of the traced code catches it
    through the code's exception table when ``certain``: the real code raises it too (a missing
    dict key), not only the capture's model of a value (an attribute it cannot see)."""

    def __init__(self, exc_type: type[BaseException], message: str | None, *, value=None,
                 certain: bool = True, args_known: tuple | None = None):
        super().__init__(f"{exc_type.__name__}: {message}" if message else exc_type.__name__)
        self.exc_type = exc_type
        self.message = message
        self.value = value  # the ExceptionVar raised, when the traced code made it
        self.certain = certain
        self.args_known = args_known  # the exception's arguments, when they are constants


def format_location(loc: dict | None) -> str:
    if not loc:
        return "<unknown location>"
    text = f"\n    {loc['text']}" if loc.get("text") else ""
    return f"{loc['file']}:{loc['line']}{text}"
