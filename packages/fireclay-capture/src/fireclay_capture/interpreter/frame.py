"""A frame under symbolic execution: its value stack, locals, cells and instruction pointer.

Handlers are registered per opcode name (``@handler("LOAD_FAST")``) and receive the frame and
the ``dis.Instruction``. When an instruction cannot be traced the frame raises
:class:`Unsupported` with its state intact (stack, locals, ``ip`` at the failing instruction),
which is what a graph break needs to resume from.
"""

from __future__ import annotations

import dis
import types
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch

from fireclay_capture.code_flags import CO_VARARGS, CO_VARKEYWORDS
from fireclay_capture.config import config
from fireclay_capture.errors import ObservedException, Unsupported
from fireclay_capture.variables.base import NULL, CellVar, Var, const, vars_made
from fireclay_capture.variables.containers import DictVar, IteratorVar, TupleVar

if TYPE_CHECKING:
    from fireclay_capture.tracer import Tracer

#: Instructions of the root frame a graph break can split at: the instruction then runs in plain
#: Python between the graph and the resume function (see ``graph_break``).
BREAKABLE = frozenset({"CALL", "CALL_FUNCTION_EX", "CALL_KW", "POP_JUMP_IF_TRUE", "POP_JUMP_IF_FALSE",
                       "POP_JUMP_FORWARD_IF_TRUE", "POP_JUMP_FORWARD_IF_FALSE", "POP_JUMP_BACKWARD_IF_TRUE",
                       "POP_JUMP_BACKWARD_IF_FALSE", "STORE_GLOBAL", "STORE_SUBSCR", "STORE_ATTR",
                       "DELETE_SUBSCR", "BEFORE_WITH", "BINARY_SUBSCR", "BINARY_SLICE", "STORE_SLICE"})
HANDLERS: dict[str, Callable[[Frame, dis.Instruction], None]] = {}


def handler(*names: str):
    def register(fn):
        for n in names:
            HANDLERS[n] = fn
        return fn

    return register


class _Return(Exception):
    def __init__(self, value: Var):
        self.value = value


_INSTRUCTIONS: dict[types.CodeType, tuple[list[dis.Instruction], dict[int, int]]] = {}


def _instructions(code: types.CodeType):
    cached = _INSTRUCTIONS.get(code)
    if cached is None:
        insts = list(dis.get_instructions(code))
        cached = (insts, {inst.offset: i for i, inst in enumerate(insts)})
        _INSTRUCTIONS[code] = cached
    return cached


@dataclass(slots=True, kw_only=True)
class BreakSnapshot:
    """The root frame's state before an instruction that could become a graph break: a break
    raised while that instruction runs (inside a call it makes, too) rewinds the trace to it."""

    inst: dis.Instruction
    stack: list  # a copy of the value stack
    kw_names: tuple[str, ...]
    n_nodes: int  # nodes in the graph
    effects: Any  # SideEffects.snapshot()
    grad_enabled: bool
    n_contexts: int  # context managers entered
    mutations: int  # the trace's mutation count
    vars_made: int  # above the number of every value made before it (Var.born)
    # Where each for-loop iterator on the stack stood (a callee may advance one after this).
    iter_positions: dict[int, int]


@dataclass(frozen=True, kw_only=True)
class ExceptionEntry:
    """One row of a 3.11+ code object's exception table: an exception raised by an instruction
    at ``start <= offset < end`` jumps to ``target`` with the value stack cut to ``depth`` (and
    the raising instruction's offset pushed first when ``lasti``)."""

    start: int
    end: int
    target: int
    depth: int
    lasti: bool


_EXCEPTION_TABLES: dict[types.CodeType, tuple[ExceptionEntry, ...]] = {}


def _read_varint(data: bytes, pos: int) -> tuple[int, int]:
    # Six bits a byte, most significant first; bit 6 says another byte follows (bit 7 marks an
    # entry's first byte and is not part of the value).
    b = data[pos]
    value = b & 63
    while b & 64:
        pos += 1
        b = data[pos]
        value = (value << 6) | (b & 63)
    return value, pos + 1


def exception_table(code: types.CodeType) -> tuple[ExceptionEntry, ...]:
    cached = _EXCEPTION_TABLES.get(code)
    if cached is None:
        data = getattr(code, "co_exceptiontable", b"")
        entries = []
        pos = 0
        while pos < len(data):
            start, pos = _read_varint(data, pos)
            length, pos = _read_varint(data, pos)
            target, pos = _read_varint(data, pos)
            depth_lasti, pos = _read_varint(data, pos)
            entries.append(ExceptionEntry(start=start * 2, end=(start + length) * 2, target=target * 2,
                                          depth=depth_lasti >> 1, lasti=bool(depth_lasti & 1)))
        cached = _EXCEPTION_TABLES[code] = tuple(entries)
    return cached


def exception_handler(code: types.CodeType, offset: int) -> ExceptionEntry | None:
    for entry in exception_table(code):
        if entry.start <= offset < entry.end:
            return entry
    return None


class Frame:
    def __init__(self, tx: Tracer, code: types.CodeType, f_globals: dict, local_vars: dict[str, Var],
                 cells: dict[str, CellVar]):
        self.tx = tx
        self.code = code
        self.f_globals = f_globals
        self.locals: dict[str, Var] = local_vars
        self.cells: dict[str, CellVar] = cells
        self.stack: list = []
        self.instructions, self.offsets = _instructions(code)
        self.ip = 0
        self.inst: dis.Instruction | None = None
        self.kw_names: tuple[str, ...] = ()
        self.yielded: list[Var] | None = None
        # The root frame's state before its last instruction that could become a graph break.
        self.before_break: BreakSnapshot | None = None
        # Cell variables that are also arguments start as cells holding the argument.
        for name in code.co_cellvars:
            if name not in self.cells:
                self.cells[name] = tx.new_cell(self.locals.pop(name, NULL))

    # -- stack helpers
    def push(self, v) -> None:
        self.stack.append(v)

    def pop(self):
        return self.stack.pop()

    def popn(self, n: int) -> list:
        if n == 0:
            return []
        items = self.stack[-n:]
        del self.stack[-n:]
        return items

    def jump_to(self, offset: int) -> None:
        self.ip = self.offsets[offset]

    # -- running
    def run(self) -> Var:
        self.tx.frames.append(self)
        is_root = len(self.tx.frames) == 1
        try:
            while True:
                inst = self.instructions[self.ip]
                self.inst = inst
                if is_root and inst.opname in BREAKABLE:
                    tx = self.tx
                    self.before_break = BreakSnapshot(
                        inst=inst, stack=self.stack[:], kw_names=self.kw_names, n_nodes=len(tx.graph.nodes),
                        effects=tx.side_effects.snapshot(), grad_enabled=torch.is_grad_enabled(),
                        n_contexts=len(tx.entered_contexts), mutations=tx.mutations, vars_made=vars_made(),
                        iter_positions={i: v.pos for i, v in enumerate(self.stack) if isinstance(v, IteratorVar)})
                self.ip += 1
                self.tx.instructions_run += 1
                if self.tx.instructions_run > config.max_instructions:
                    raise Unsupported(f"more than {config.max_instructions} bytecode instructions "
                                      "(a loop that does not end at trace time?)")
                fn = HANDLERS.get(inst.opname)
                if fn is None:
                    raise Unsupported(f"the bytecode instruction {inst.opname} is not supported")
                try:
                    fn(self, inst)
                except ObservedException as e:
                    if not self.catch(e, inst):
                        raise
        except _Return as r:
            return r.value
        except Unsupported as e:
            if e.location is None:
                e.location = self.tx.location(self)
                e.stack = self.tx.call_stack()
                # The innermost frame, stopped at the failing instruction with its stack and
                # locals as they were: where a graph break would resume.
                e.frame = self
            raise
        except Exception as e:  # a fault of the capture itself: remember the innermost user line
            if getattr(e, "capture_location", None) is None:
                try:
                    e.capture_location = self.tx.location(self)  # type: ignore[attr-defined]
                except AttributeError:
                    pass
            raise
        finally:
            self.tx.frames.pop()

    def catch(self, exc: ObservedException, inst: dis.Instruction) -> bool:
        """Follow the code's exception table for an exception raised by ``inst`` (here or in a
        call it made): when a handler of this frame covers it, jump there as CPython would."""
        if not exc.certain or self.yielded is not None:
            return False
        entry = exception_handler(self.code, inst.offset)
        if entry is None:
            return False
        from fireclay_capture.variables.exceptions import exception_value

        value = exception_value(exc)
        del self.stack[entry.depth:]
        if entry.lasti:
            self.push(const(inst.offset))
        self.push(value)
        self.kw_names = ()
        self.jump_to(entry.target)
        return True

    def run_generator(self) -> IteratorVar:
        """Run a generator to exhaustion at trace time; its yields become an iterator's items."""
        self.yielded = []
        changes = self.tx.side_effects.version
        self.run()
        if self.tx.side_effects.version != changes:
            # Unrolled at trace time, its changes would land before the consumer's own.
            raise Unsupported(f"the generator {self.code.co_qualname} changes objects outside the capture")
        return IteratorVar(self.yielded)

    def do_return(self, value: Var) -> None:
        raise _Return(value)


def bind_arguments(code: types.CodeType, args: list[Var], kwargs: dict[str, Var],
                   defaults: list[Var], kwdefaults: dict[str, Var]) -> dict[str, Var]:
    """Python's argument binding, over Vars."""
    name = code.co_qualname
    nargs = code.co_argcount
    nkw = code.co_kwonlyargcount
    names = code.co_varnames
    pos_names = names[:nargs]
    kw_names = names[nargs:nargs + nkw]
    has_varargs = bool(code.co_flags & CO_VARARGS)
    has_varkw = bool(code.co_flags & CO_VARKEYWORDS)
    bound: dict[str, Var] = {}
    for n, a in zip(pos_names, args):
        bound[n] = a
    extra = list(args[nargs:])
    if extra and not has_varargs:
        raise Unsupported(f"{name}() takes {nargs} positional arguments but {len(args)} were given")
    varkw: dict[str, Var] = {}
    posonly = set(pos_names[:code.co_posonlyargcount])
    for k, v in kwargs.items():
        if k in bound and k in pos_names:
            raise Unsupported(f"{name}() got multiple values for argument {k!r}")
        if (k in pos_names and k not in posonly) or k in kw_names:
            bound[k] = v
        elif has_varkw:
            varkw[k] = v
        else:
            raise Unsupported(f"{name}() got an unexpected keyword argument {k!r}")
    first_default = nargs - len(defaults)
    for i, n in enumerate(pos_names):
        if n not in bound:
            if i >= first_default:
                bound[n] = defaults[i - first_default]
            else:
                raise Unsupported(f"{name}() missing required argument {n!r}")
    for n in kw_names:
        if n not in bound:
            if n in kwdefaults:
                bound[n] = kwdefaults[n]
            else:
                raise Unsupported(f"{name}() missing required keyword-only argument {n!r}")
    i = nargs + nkw
    if has_varargs:
        bound[names[i]] = TupleVar(extra)
        i += 1
    if has_varkw:
        bound[names[i]] = DictVar(varkw)
    return bound


def truth(frame: Frame, v: Var) -> bool:
    try:
        return v.truth(frame.tx)
    except ObservedException:
        raise
    except Unsupported:
        raise


__all__ = ["HANDLERS", "Frame", "bind_arguments", "const", "handler", "truth"]
