"""``raise`` and ``try``/``except``/``finally`` inside traced code (CPython 3.11+ exception tables).

An exception the interpreter can model (a missing dict key, an AttributeError of a constant, a
``raise`` of an exception made in the trace) travels as :class:`ObservedException`; a frame whose
exception table covers the raising instruction catches it (``Frame.catch``) and runs its handler
here, as CPython does, so that ``Mapping.get`` over a ``__getitem__`` that raises KeyError stays
in the graph. The exception being handled is the tracer's ``handled_exception`` (what
``sys.exc_info()`` would return), saved and restored by PUSH_EXC_INFO and POP_EXCEPT.
"""

from __future__ import annotations

from fireclay_capture.errors import Unsupported
from fireclay_capture.interpreter.frame import Frame, handler
from fireclay_capture.variables.base import ConstVar, const
from fireclay_capture.variables.containers import TupleVar
from fireclay_capture.variables.exceptions import ExceptionVar, is_exception_class, raise_value


def _handled(frame: Frame):
    return frame.tx.handled_exception or const(None)


@handler("RAISE_VARARGS")
def raise_varargs(frame: Frame, inst) -> None:
    if inst.arg == 0:  # a bare `raise`: the exception being handled
        current = _handled(frame)
        if not isinstance(current, ExceptionVar):
            raise Unsupported("a bare `raise` with no exception being handled")
        raise raise_value(frame.tx, current)
    cause = frame.pop() if inst.arg == 2 else None
    raise raise_value(frame.tx, frame.pop(), cause)


@handler("PUSH_EXC_INFO")
def push_exc_info(frame: Frame, inst) -> None:
    value = frame.pop()
    frame.push(_handled(frame))
    frame.tx.handled_exception = value
    frame.push(value)


@handler("POP_EXCEPT")
def pop_except(frame: Frame, inst) -> None:
    prior = frame.pop()
    frame.tx.handled_exception = None if isinstance(prior, ConstVar) and prior.value is None else prior


def _exception_classes(v) -> tuple[type, ...]:
    items = v.items if isinstance(v, TupleVar) else [v]
    classes = []
    for item in items:
        cls = item.identity()
        if not is_exception_class(cls):
            raise Unsupported(f"`except {item}`: not an exception class the capture can see")
        classes.append(cls)
    return tuple(classes)


@handler("CHECK_EXC_MATCH")
def check_exc_match(frame: Frame, inst) -> None:
    classes = _exception_classes(frame.pop())
    frame.push(const(issubclass(frame.stack[-1].python_type(), classes)))


@handler("RERAISE")
def reraise(frame: Frame, inst) -> None:
    value = frame.pop()
    if not isinstance(value, ExceptionVar):
        raise Unsupported(f"re-raising {value}")
    raise raise_value(frame.tx, value)


@handler("WITH_EXCEPT_START")
def with_except_start(frame: Frame, inst) -> None:
    # Stack: ..., __exit__, lasti, prior exception, exception. __exit__(type, value, traceback)
    # decides whether the exception is suppressed.
    from fireclay_capture.variables.builder import wrap

    value = frame.stack[-1]
    if not isinstance(value, ExceptionVar):
        raise Unsupported(f"a `with` block left by {value}")
    exit_fn = frame.stack[-4]
    frame.push(exit_fn.call(frame.tx, [wrap(frame.tx, value.cls, None), value, const(None)], {}))
