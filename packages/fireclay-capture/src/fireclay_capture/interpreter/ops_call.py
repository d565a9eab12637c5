"""Calls (CALL, CALL_KW, CALL_FUNCTION_EX) and function creation (MAKE_FUNCTION)."""

from __future__ import annotations

from fireclay_capture.errors import Unsupported
from fireclay_capture.interpreter.frame import Frame, handler
from fireclay_capture.variables.base import NULL, Var
from fireclay_capture.variables.containers import DictVar, TupleVar
from fireclay_capture.variables.functions import NestedFunctionVar
from fireclay_capture.variables.objects import ModelOutputVar


def call_function(frame: Frame, fn: Var, args: list[Var], kwargs: dict[str, Var]) -> Var:
    return fn.call(frame.tx, args, kwargs)


def _pop_callable(frame: Frame, args: list[Var]) -> tuple[Var, list[Var]]:
    # Below the arguments: [NULL, callable] or [callable, self] (3.11/3.12), [callable, NULL|self]
    # (3.13). A NULL on either side means a plain call; otherwise a method called with self.
    top = frame.pop()
    below = frame.pop()
    if below is NULL:
        return top, args
    if top is NULL:
        return below, args
    return below, [top, *args]


@handler("CALL")
def call(frame: Frame, inst) -> None:
    args = frame.popn(inst.arg)
    kw = frame.kw_names
    frame.kw_names = ()
    kwargs = {}
    if kw:
        kwargs = dict(zip(kw, args[-len(kw):]))
        args = args[:-len(kw)]
    fn, args = _pop_callable(frame, args)
    frame.push(call_function(frame, fn, args, kwargs))


@handler("CALL_KW")
def call_kw(frame: Frame, inst) -> None:
    kw = frame.pop().as_python_constant()
    args = frame.popn(inst.arg)
    kwargs = dict(zip(kw, args[len(args) - len(kw):]))
    args = args[:len(args) - len(kw)]
    fn, args = _pop_callable(frame, args)
    frame.push(call_function(frame, fn, args, kwargs))


@handler("CALL_FUNCTION_EX")
def call_function_ex(frame: Frame, inst) -> None:
    kwargs_var = frame.pop() if inst.arg & 1 else DictVar({})
    args_var = frame.pop()
    fn = frame.pop()
    if frame.stack and frame.stack[-1] is NULL:
        frame.pop()
    elif fn is NULL:  # 3.13: [callable, NULL, args, kwargs]
        fn = frame.pop()
    if isinstance(kwargs_var, ModelOutputVar):
        kwargs_var = kwargs_var.as_dict()
    if not isinstance(kwargs_var, DictVar):
        raise Unsupported(f"** of {kwargs_var}")
    kwargs = {}
    for k, v in kwargs_var.items.items():
        if not isinstance(k, str):
            raise Unsupported("keywords must be strings")
        kwargs[k] = v
    frame.push(call_function(frame, fn, args_var.unpack(frame.tx), kwargs))


@handler("MAKE_FUNCTION")
def make_function(frame: Frame, inst) -> None:
    code = frame.pop().as_python_constant()
    flags = inst.arg or 0
    closure = frame.pop() if flags & 0x08 else None
    if flags & 0x04:
        frame.pop()  # annotations: not needed to run the function
    kwdefaults = frame.pop() if flags & 0x02 else None
    defaults = frame.pop() if flags & 0x01 else None
    frame.push(_make(frame, code, defaults, kwdefaults, closure))


def _make(frame: Frame, code, defaults, kwdefaults, closure) -> NestedFunctionVar:
    cells = {}
    if closure is not None:
        cells = dict(zip(code.co_freevars, closure.items))
    return NestedFunctionVar(
        code, frame.f_globals,
        defaults.items if isinstance(defaults, TupleVar) else
        ([] if defaults is None else defaults.unpack(frame.tx)),
        dict(kwdefaults.items) if isinstance(kwdefaults, DictVar) else {},
        cells,
    )


@handler("SET_FUNCTION_ATTRIBUTE")
def set_function_attribute(frame: Frame, inst) -> None:
    fn = frame.pop()
    value = frame.pop()
    if inst.arg == 0x08:
        fn.cells = dict(zip(fn.code.co_freevars, value.items))
    elif inst.arg == 0x02:
        fn.kwdefaults = dict(value.items)
    elif inst.arg == 0x01:
        fn.defaults = value.unpack(frame.tx)
    frame.push(fn)
