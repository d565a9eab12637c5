"""Exception objects made or caught inside the trace (``KeyError(k)``, ``except E as e``)."""

from __future__ import annotations

from typing import Any

from fireclay_capture.errors import ObservedException, Unsupported
from fireclay_capture.variables.base import Var, const
from fireclay_capture.variables.containers import TupleVar


class ExceptionVar(Var):
    """An exception instance known at trace time: its class and its arguments."""

    def __init__(self, cls: type[BaseException], args: list[Var]):
        self.cls = cls
        self.args = list(args)
        self.cause: Var | None = None

    def python_type(self) -> type:
        return self.cls

    def as_python_constant(self) -> Any:
        # Only to format it (``str(e)``, f-strings): a real instance with the same arguments.
        return self.cls(*[a.as_python_constant() for a in self.args])

    def getattr(self, tx, name):
        if name == "args":
            return TupleVar(self.args)
        if name in ("__cause__", "__context__"):
            return self.cause if self.cause is not None else const(None)
        if name == "__traceback__":
            return const(None)
        if name == "__class__":
            return tx.wrap(self.cls, None)
        raise Unsupported(f"attribute {name!r} of an exception raised inside the captured function")

    def __repr__(self) -> str:
        return f"ExceptionVar({self.cls.__name__})"


def is_exception_class(value: Any) -> bool:
    return isinstance(value, type) and issubclass(value, BaseException)


def make_exception(cls: type[BaseException], args: list[Var], kwargs: dict[str, Var]) -> ExceptionVar:
    """``cls(*args)`` for an exception class whose construction only stores its arguments."""
    if kwargs:
        raise Unsupported(f"{cls.__name__}() with keyword arguments inside the captured function")
    for klass in cls.__mro__:
        if klass is BaseException or klass.__module__ == "builtins":
            break
        if "__init__" in vars(klass) or "__new__" in vars(klass):
            raise Unsupported(f"creating exception {cls.__qualname__} (it defines __init__ or __new__)")
    return ExceptionVar(cls, args)


def exception_value(exc: ObservedException) -> ExceptionVar:
    """The Var of the exception an :class:`ObservedException` stands for."""
    if exc.value is not None:
        return exc.value
    if exc.args_known is not None:
        return ExceptionVar(exc.exc_type, [const(a) for a in exc.args_known])
    message = exc.message
    return ExceptionVar(exc.exc_type, [const(message)] if message is not None else [])


def raise_value(tx, value: Var, cause: Var | None = None) -> ObservedException:
    """The ObservedException that ``raise value [from cause]`` throws."""
    if not isinstance(value, ExceptionVar):
        cls = value.identity()
        if not is_exception_class(cls):
            raise Unsupported(f"raising {value}, which is not an exception")
        value = make_exception(cls, [], {})
    if not isinstance(value, ExceptionVar):
        raise Unsupported(f"raising {value}")
    if cause is not None:
        value.cause = cause
    return ObservedException(value.cls, _message(value), value=value)


def _message(value: ExceptionVar) -> str:
    try:
        return str(value.as_python_constant())
    except Exception:
        return value.cls.__name__


__all__ = ["ExceptionVar", "exception_value", "is_exception_class", "make_exception", "raise_value"]
