"""Which locals are live at an instruction: read on some path from there before being written.

A graph break passes only live locals to its resume function (and makes only those graph
outputs), so a dead tensor is freed when the graph is done with it instead of being kept alive
by the rest of the function. Backward data flow over the bytecode's control-flow graph, with an
edge from every instruction inside a try/with region to its handler.
"""

from __future__ import annotations

import dis
import types

_USES = frozenset({"LOAD_FAST", "LOAD_FAST_CHECK", "LOAD_FAST_AND_CLEAR", "DELETE_FAST"})
_ENDS = frozenset({"RETURN_VALUE", "RETURN_CONST", "RAISE_VARARGS", "RERAISE"})
_JUMPS = frozenset({"JUMP_FORWARD", "JUMP_BACKWARD", "JUMP_BACKWARD_NO_INTERRUPT", "JUMP", "JUMP_NO_INTERRUPT",
                    "JUMP_ABSOLUTE"})
# Code that reads its locals by name (``locals()``, ``eval``...) keeps every local alive.
_READS_ALL = frozenset({"locals", "vars", "eval", "exec", "dir"})
_JUMP_OPS = frozenset(dis.hasjrel) | frozenset(dis.hasjabs)

_TABLES: dict[types.CodeType, dict[int, frozenset[str]] | None] = {}


def _uses_and_defs(inst: dis.Instruction) -> tuple[tuple[str, ...], tuple[str, ...]]:
    name = inst.opname
    if name in _USES:
        return (inst.argval,), ()
    if name == "STORE_FAST":
        return (), (inst.argval,)
    if name == "LOAD_FAST_LOAD_FAST":
        return tuple(inst.argval), ()
    if name == "STORE_FAST_LOAD_FAST":
        store, load = inst.argval
        return ((load,) if load != store else ()), (store,)
    if name == "STORE_FAST_STORE_FAST":
        return (), tuple(inst.argval)
    return (), ()


def _table(code: types.CodeType) -> dict[int, frozenset[str]] | None:
    if code in _TABLES:
        return _TABLES[code]
    insts = [i for i in dis.get_instructions(code) if i.opname != "CACHE"]
    if any(i.opname in ("LOAD_GLOBAL", "LOAD_NAME") and i.argval in _READS_ALL for i in insts):
        _TABLES[code] = None
        return None
    index = {inst.offset: k for k, inst in enumerate(insts)}
    handlers = [(e.start, e.end, e.target) for e in dis.Bytecode(code).exception_entries]  # type: ignore[attr-defined]  # 3.11+, missing from the stubs
    succs: list[list[int]] = []
    for k, inst in enumerate(insts):
        out = []
        if inst.opname not in _ENDS and inst.opname not in _JUMPS and k + 1 < len(insts):
            out.append(k + 1)
        if inst.opcode in _JUMP_OPS and inst.argval in index:
            out.append(index[inst.argval])
        out += [index[t] for s, e, t in handlers if s <= inst.offset < e and t in index]
        succs.append(out)
    effects = [_uses_and_defs(i) for i in insts]
    live_in: list[frozenset[str]] = [frozenset()] * len(insts)
    changed = True
    while changed:
        changed = False
        for k in range(len(insts) - 1, -1, -1):
            live_out: set[str] = set()
            for s in succs[k]:
                live_out |= live_in[s]
            uses, defs = effects[k]
            new = frozenset(live_out.difference(defs).union(uses))
            if new != live_in[k]:
                live_in[k] = new
                changed = True
    table = {inst.offset: live_in[k] for k, inst in enumerate(insts)}
    _TABLES[code] = table
    return table


def live_locals(code: types.CodeType, offset: int) -> frozenset[str] | None:
    """The locals live at the instruction at ``offset``; None means every local (the analysis
    does not apply, e.g. the code calls ``locals()``)."""
    table = _table(code)
    return None if table is None else table.get(offset)


__all__ = ["live_locals"]
