"""Calls whose only effect lies outside the program (logging, ``warnings.warn``): recorded while
tracing and made after the graph has run, with the same constant arguments, in order with the
frame's other side effects. TorchDynamo keeps such calls out of its graphs the same way
(reorderable logging functions) rather than splitting the graph at each message.

A call whose arguments are not constants of the trace (a tensor, say) stays a graph break: the
message would need the graph's values before the graph has run.
"""

from __future__ import annotations

import logging
import warnings
from typing import Any

from fireclay_capture.config import config
from fireclay_capture.errors import Unsupported
from fireclay_capture.variables.base import Var, const

# Methods of logging.Logger (and what transformers adds to it: ``warning_once`` and ``info_once``
# are lru_cache-wrapped, so the replayed call warns once as eagerly) that only emit a message.
LOGGER_METHODS = frozenset({"debug", "info", "warning", "warn", "error", "critical", "exception", "log",
                            "warning_once", "info_once", "warning_advice"})
# Logger methods that only read the logging configuration: answered at trace time.
_LOGGER_QUERIES = frozenset({"isEnabledFor", "getEffectiveLevel"})

REPLAYED_FUNCTIONS = frozenset({warnings.warn, logging.debug, logging.info, logging.warning, logging.error,
                                logging.critical, logging.log, logging.exception})


def _name(fn: Any) -> str:
    owner = getattr(fn, "__self__", None)
    if isinstance(owner, logging.Logger):
        return f"logger.{fn.__name__}"
    return f"{getattr(fn, '__module__', None) or ''}.{getattr(fn, '__name__', fn)}".lstrip(".")


def record_replayed_call(tx, fn: Any, args: list[Var], kwargs: dict[str, Var]) -> Var:
    if not config.replay_side_effects:
        raise Unsupported(f"a call to {_name(fn)} (a side effect; replaying side effects is off)")
    values = [_argument(fn, a) for a in [*args, *kwargs.values()]]
    call_args, call_kwargs = tuple(values[:len(args)]), dict(zip(kwargs, values[len(args):]))
    if fn is warnings.warn:
        fn, call_args, call_kwargs = _warning_at_its_line(tx, call_args, call_kwargs)
    tx.side_effects.record_call(fn, call_args, call_kwargs)
    return const(None)


def _warning_at_its_line(tx, args: tuple, kwargs: dict) -> tuple[Any, tuple, dict]:
    """``warnings.warn`` made after the graph still names the user's line (the frame
    ``stacklevel`` up from the call, when that frame is one the trace inlined) and uses that
    module's registry, so that filters and "once per location" act as they would eagerly."""
    bound = dict(zip(("message", "category", "stacklevel"), args), **kwargs)
    level = bound.get("stacklevel", 1)
    if set(bound) - {"message", "category", "stacklevel"} or not isinstance(level, int) \
            or not 1 <= level <= len(tx.frames):
        return warnings.warn, args, kwargs
    frame = tx.frames[-level]
    where = tx.location(frame)
    if where is None:
        return warnings.warn, args, kwargs
    return _warn_at, (bound["message"], bound.get("category"), where["file"], where["line"], frame.f_globals), {}


def _warn_at(message: Any, category: Any, filename: str, lineno: int, f_globals: dict) -> None:
    if isinstance(message, Warning):
        category = type(message)
    registry = f_globals.setdefault("__warningregistry__", {})
    warnings.warn_explicit(message, category or UserWarning, filename, lineno,
                           module=f_globals.get("__name__", "<string>"), registry=registry,
                           module_globals=f_globals)


def _argument(fn: Any, a: Var) -> Any:
    """The real value of one argument: a constant of the trace, or an object that existed before
    it (a warning category, a config formatted into the message)."""
    from fireclay_capture.variables.tensor import TensorVar

    if a.is_constant():
        return a.as_python_constant()
    if a.identity() is not a and not isinstance(a, TensorVar):
        return a.identity()
    raise Unsupported(f"a call to {_name(fn)} with an argument that is not a constant of the trace ({a})")


class ReplayedCallVar(Var):
    """A logging or warning function: calling it records the call for after the graph."""

    def __init__(self, fn: Any, source=None):
        self.fn = fn
        self.source = source

    def python_type(self):
        return type(self.fn)

    def identity(self):
        return self.fn

    def call(self, tx, args, kwargs):
        return record_replayed_call(tx, self.fn, args, kwargs)

    def __repr__(self):
        return f"replayed call {_name(self.fn)}"


class LoggerVar(Var):
    """A ``logging.Logger``: its message methods are replayed after the graph, its level queries
    answered at trace time."""

    def __init__(self, logger: logging.Logger, source=None):
        self.logger = logger
        self.source = source

    def python_type(self):
        return type(self.logger)

    def identity(self):
        return self.logger

    def getattr(self, tx, name):
        from fireclay_capture.variables.base import ConstMethodVar, ConstVar

        if name in LOGGER_METHODS and hasattr(self.logger, name):
            return ReplayedCallVar(getattr(self.logger, name))
        if name in _LOGGER_QUERIES:
            return ConstMethodVar(ConstVar(self.logger), name, getattr(self.logger, name))
        if name in ("name", "level", "disabled", "propagate"):
            return const(getattr(self.logger, name))
        if self.source is not None:  # anything else reads like any object's attribute
            from fireclay_capture.variables.objects import ObjectVar

            return ObjectVar(self.logger, self.source).getattr(tx, name)
        raise Unsupported(f"attribute {name!r} of logger {self.logger.name!r}")

    def __repr__(self):
        return f"logger {self.logger.name!r}"
