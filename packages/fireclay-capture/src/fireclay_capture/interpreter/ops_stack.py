"""Stack shuffling, no-ops, unary/binary operators, comparisons and string formatting."""

from __future__ import annotations

import dis
import operator
from typing import Any

from fireclay_capture.builtins import apply_operator, contains
from fireclay_capture.dynamic import concrete
from fireclay_capture.errors import Unsupported
from fireclay_capture.interpreter.frame import Frame, handler
from fireclay_capture.variables.base import NULL, ConstVar
from fireclay_capture.variables.containers import ListVar, TupleVar
from fireclay_capture.variables.tensor import TensorVar, record_call


@handler("NOP", "RESUME", "PRECALL", "CACHE", "EXTENDED_ARG", "RESERVED", "NOT_TAKEN",
         "INSTRUMENTED_RESUME")
def nop(frame: Frame, inst) -> None:
    return None


@handler("POP_TOP")
def pop_top(frame: Frame, inst) -> None:
    frame.pop()


@handler("PUSH_NULL")
def push_null(frame: Frame, inst) -> None:
    frame.push(NULL)


@handler("COPY")
def copy(frame: Frame, inst) -> None:
    frame.push(frame.stack[-inst.arg])


@handler("SWAP")
def swap(frame: Frame, inst) -> None:
    s = frame.stack
    s[-1], s[-inst.arg] = s[-inst.arg], s[-1]


@handler("KW_NAMES")
def kw_names(frame: Frame, inst) -> None:
    frame.kw_names = tuple(frame.code.co_consts[inst.arg])


# BINARY_OP's oparg indexes this table (dis._nb_ops); the in-place forms follow the plain ones.
_NB_OPS = [operator.add, operator.and_, operator.floordiv, operator.lshift, operator.matmul,
           operator.mul, operator.mod, operator.or_, operator.pow, operator.rshift, operator.sub,
           operator.truediv, operator.xor]
_NB_INPLACE = [operator.iadd, operator.iand, operator.ifloordiv, operator.ilshift, operator.imatmul,
               operator.imul, operator.imod, operator.ior, operator.ipow, operator.irshift,
               operator.isub, operator.itruediv, operator.ixor]
_DIS_NB_OPS: list[tuple[str, str]] = vars(dis)["_nb_ops"]  # private in dis (and its stubs): checked here
assert [n for n, _ in _DIS_NB_OPS[:13]] == ["NB_ADD", "NB_AND", "NB_FLOOR_DIVIDE", "NB_LSHIFT",
                                            "NB_MATRIX_MULTIPLY", "NB_MULTIPLY", "NB_REMAINDER",
                                            "NB_OR", "NB_POWER", "NB_RSHIFT", "NB_SUBTRACT",
                                            "NB_TRUE_DIVIDE", "NB_XOR"]


@handler("BINARY_OP")
def binary_op(frame: Frame, inst) -> None:
    b = frame.pop()
    a = frame.pop()
    if inst.arg == 26:  # NB_SUBSCR (3.14)
        frame.push(a.getitem(frame.tx, b))
        return
    fn = _NB_OPS[inst.arg] if inst.arg < 13 else _NB_INPLACE[inst.arg - 13]
    frame.push(apply_operator(frame.tx, fn, [a, b]))


_UNARY = {"UNARY_NEGATIVE": operator.neg, "UNARY_POSITIVE": operator.pos, "UNARY_INVERT": operator.invert}


@handler("UNARY_NEGATIVE", "UNARY_POSITIVE", "UNARY_INVERT")
def unary(frame: Frame, inst) -> None:
    frame.push(apply_operator(frame.tx, _UNARY[inst.opname], [frame.pop()]))


@handler("UNARY_NOT")
def unary_not(frame: Frame, inst) -> None:
    frame.push(ConstVar(not frame.pop().truth(frame.tx)))


@handler("TO_BOOL")
def to_bool(frame: Frame, inst) -> None:
    v = frame.pop()
    frame.push(v if isinstance(v, ConstVar) and isinstance(v.value, bool) else ConstVar(v.truth(frame.tx)))


_COMPARE = {"<": operator.lt, "<=": operator.le, "==": operator.eq, "!=": operator.ne,
            ">": operator.gt, ">=": operator.ge}


@handler("COMPARE_OP")
def compare_op(frame: Frame, inst) -> None:
    b = frame.pop()
    a = frame.pop()
    op = str(inst.argval)
    if op.startswith("bool("):  # 3.13 marks comparisons whose result feeds a branch
        op = op[5:-1]
    result = apply_operator(frame.tx, _COMPARE[op], [a, b])
    frame.push(result)


@handler("IS_OP")
def is_op(frame: Frame, inst) -> None:
    b = frame.pop()
    a = frame.pop()
    same = a.identity() is b.identity() if not (isinstance(a, TensorVar) and isinstance(b, TensorVar)) \
        else a.value is b.value
    frame.push(ConstVar(same != bool(inst.arg)))


@handler("CONTAINS_OP")
def contains_op(frame: Frame, inst) -> None:
    container = frame.pop()
    item = frame.pop()
    frame.push(ConstVar(contains(frame.tx, item, container) != bool(inst.arg)))


_CONVERSIONS: dict[int, Any] = {0: None, 1: str, 2: repr, 3: ascii}


def _format(value, spec: str):
    if isinstance(value, TensorVar):
        raise Unsupported("formatting a tensor into a string (needs its data)")
    return format(concrete(value.as_python_constant()), spec)


@handler("FORMAT_VALUE")
def format_value(frame: Frame, inst) -> None:
    spec = frame.pop().as_python_constant() if inst.arg & 0x04 else ""
    value = frame.pop()
    conv = _CONVERSIONS[inst.arg & 0x03]
    if conv is not None:
        if isinstance(value, TensorVar):
            raise Unsupported("formatting a tensor into a string (needs its data)")
        value = ConstVar(conv(concrete(value.as_python_constant())))
    frame.push(ConstVar(_format(value, spec)))


@handler("FORMAT_SIMPLE")
def format_simple(frame: Frame, inst) -> None:
    frame.push(ConstVar(_format(frame.pop(), "")))


@handler("FORMAT_WITH_SPEC")
def format_with_spec(frame: Frame, inst) -> None:
    spec = frame.pop().as_python_constant()
    frame.push(ConstVar(_format(frame.pop(), spec)))


@handler("CONVERT_VALUE")
def convert_value(frame: Frame, inst) -> None:
    value = frame.pop()
    frame.push(ConstVar(_CONVERSIONS[inst.arg](concrete(value.as_python_constant()))))


@handler("BUILD_STRING")
def build_string(frame: Frame, inst) -> None:
    parts = frame.popn(inst.arg)
    frame.push(ConstVar("".join(p.as_python_constant() for p in parts)))


@handler("CALL_INTRINSIC_1")
def call_intrinsic_1(frame: Frame, inst) -> None:
    value = frame.pop()
    if inst.arg == 5:  # INTRINSIC_UNARY_POSITIVE
        frame.push(apply_operator(frame.tx, operator.pos, [value]))
    elif inst.arg == 6:  # INTRINSIC_LIST_TO_TUPLE
        frame.push(TupleVar(value.unpack(frame.tx)))
    elif inst.arg == 3:  # INTRINSIC_STOPITERATION_ERROR: only on the exception path
        raise Unsupported("an exception raised inside a generator")
    else:
        raise Unsupported(f"CALL_INTRINSIC_1 {inst.argrepr}")


@handler("LIST_TO_TUPLE")
def list_to_tuple(frame: Frame, inst) -> None:
    frame.push(TupleVar(frame.pop().unpack(frame.tx)))


__all__ = ["ListVar", "record_call"]
