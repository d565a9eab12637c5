"""BUILD_* and the in-place builders of comprehensions, UNPACK_*, GET_ITER / FOR_ITER."""

from __future__ import annotations

from fireclay_capture import bytecode_versions as versions
from fireclay_capture.errors import Unsupported
from fireclay_capture.interpreter.frame import Frame, handler
from fireclay_capture.variables.base import ConstVar
from fireclay_capture.variables.containers import DictVar, IteratorVar, ListVar, SetVar, SliceVar, TupleVar
from fireclay_capture.variables.objects import ModelOutputVar


@handler("BUILD_TUPLE")
def build_tuple(frame: Frame, inst) -> None:
    frame.push(TupleVar(frame.popn(inst.arg)))


@handler("BUILD_LIST")
def build_list(frame: Frame, inst) -> None:
    frame.push(ListVar(frame.popn(inst.arg)))


@handler("BUILD_SET")
def build_set(frame: Frame, inst) -> None:
    frame.push(SetVar(frame.popn(inst.arg)))


@handler("BUILD_MAP")
def build_map(frame: Frame, inst) -> None:
    flat = frame.popn(2 * inst.arg)
    d = DictVar({})
    for k, v in zip(flat[::2], flat[1::2]):
        d.setitem(frame.tx, k, v)
    frame.push(d)


@handler("BUILD_CONST_KEY_MAP")
def build_const_key_map(frame: Frame, inst) -> None:
    keys = frame.pop().as_python_constant()
    values = frame.popn(inst.arg)
    frame.push(DictVar(dict(zip(keys, values))))


@handler("BUILD_SLICE")
def build_slice(frame: Frame, inst) -> None:
    parts = frame.popn(inst.arg)
    if all(p.is_constant() for p in parts):
        frame.push(ConstVar(slice(*[p.as_python_constant() for p in parts])))
    else:  # its use as an index is where a graph can break
        frame.push(SliceVar(parts))


@handler("LIST_APPEND")
def list_append(frame: Frame, inst) -> None:
    # Through the list's own method, which notes the change: on Python 3.12+ a comprehension runs
    # inline, so after a graph break inside it the list being built is an input of the resumed
    # code, and an append only to the traced copy would be lost
    v = frame.pop()
    frame.stack[-inst.arg].method(frame.tx, "append", [v], {})


@handler("SET_ADD")
def set_add(frame: Frame, inst) -> None:
    v = frame.pop()
    frame.stack[-inst.arg].method(frame.tx, "add", [v], {})


@handler("MAP_ADD")
def map_add(frame: Frame, inst) -> None:
    v = frame.pop()
    k = frame.pop()
    frame.stack[-inst.arg].setitem(frame.tx, k, v)


@handler("LIST_EXTEND")
def list_extend(frame: Frame, inst) -> None:
    v = frame.pop()
    frame.stack[-inst.arg].method(frame.tx, "extend", [v], {})


@handler("SET_UPDATE")
def set_update(frame: Frame, inst) -> None:
    v = frame.pop()
    target = frame.stack[-inst.arg]
    target.method(frame.tx, "update", [v], {})  # a frozenset constant is merged as CPython merges it


@handler("DICT_UPDATE", "DICT_MERGE")
def dict_update(frame: Frame, inst) -> None:
    v = frame.pop()
    target = frame.stack[-inst.arg]
    if isinstance(v, ModelOutputVar):
        v = v.as_dict()
    if not isinstance(v, DictVar):
        raise Unsupported(f"** unpacking of {v}")
    if inst.opname == "DICT_MERGE":
        dup = set(target.items) & set(v.items)
        if dup:
            raise Unsupported(f"got multiple values for keyword argument {sorted(dup)[0]!r}")
    target._mutable(frame.tx)  # the dict may be an input of resumed code, as LIST_APPEND's list
    target.items.update(v.items)
    target.key_vars.update(v.key_vars)


@handler("UNPACK_SEQUENCE")
def unpack_sequence(frame: Frame, inst) -> None:
    items = frame.pop().unpack(frame.tx)
    if len(items) != inst.arg:
        raise Unsupported(f"cannot unpack {len(items)} values into {inst.arg}")
    for item in reversed(items):
        frame.push(item)


@handler("UNPACK_EX")
def unpack_ex(frame: Frame, inst) -> None:
    before, after = inst.arg & 0xFF, inst.arg >> 8
    items = frame.pop().unpack(frame.tx)
    if len(items) < before + after:
        raise Unsupported(f"not enough values to unpack (expected at least {before + after})")
    head = items[:before]
    middle = items[before:len(items) - after]
    tail = items[len(items) - after:]
    for item in reversed(tail):
        frame.push(item)
    frame.push(ListVar(middle))
    for item in reversed(head):
        frame.push(item)


@handler("GET_ITER", "GET_YIELD_FROM_ITER")
def get_iter(frame: Frame, inst) -> None:
    v = frame.pop()
    frame.push(v if isinstance(v, IteratorVar) else IteratorVar(v.unpack(frame.tx)))


@handler("FOR_ITER")
def for_iter(frame: Frame, inst) -> None:
    it = frame.stack[-1]
    if not isinstance(it, IteratorVar):
        raise Unsupported(f"iterating over {it}")
    item = it.next()
    if item is not None:
        frame.push(item)
        return
    frame.jump_to(inst.argval)
    if versions.FOR_ITER_EXHAUSTED == "leave_for_end_for":
        frame.push(ConstVar(None))
        return
    frame.pop()
    if versions.FOR_ITER_EXHAUSTED == "pop_skip_end_for" and frame.instructions[frame.ip].opname == "END_FOR":
        frame.ip += 1


@handler("END_FOR")
def end_for(frame: Frame, inst) -> None:
    for _ in range(versions.END_FOR_POPS):
        frame.pop()


@handler("POP_ITER")
def pop_iter(frame: Frame, inst) -> None:
    frame.pop()
