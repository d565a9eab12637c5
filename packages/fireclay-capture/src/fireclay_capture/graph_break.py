"""Graph breaks: split a function at an instruction the capture cannot trace.

When the root frame stops at a call, a branch, a store, a subscript or a ``with`` it cannot
trace, the graph captured up to that instruction becomes a cache entry whose outputs are the
tensors the rest of the function needs (the value stack, the locals live there, the frame's
cells). Running that entry means:

1. the compiled graph runs;
2. the stack entries, locals and cells are rebuilt as Python objects around the graph's results,
   then the changes the trace made to outside objects are replayed (``side_effects.py``);
3. the instruction runs in plain Python (a call to a Python function is wrapped so that the
   callee is captured on its own). Inside a try or with block it runs in a *trampoline*: the
   function's own code entered at that instruction, so that its exception table sends an
   exception to the user's except, finally or ``__exit__``; the trampoline then leaves every
   region and hands the frame's state back here;
4. a *resume function* (``resume.py``), captured like any function, continues from the
   instruction after the break (from the jump target, for a branch that jumps).

A break inside an inlined call splits the root frame at the call that reached it: the nodes and
recorded changes of the callee are dropped, and the callee runs (captured on its own) as the
break's call.
"""

from __future__ import annotations

import threading
import types
from dataclasses import dataclass, field
from typing import Any

import torch

from fireclay_capture.code_flags import suspends
from fireclay_capture.config import config
from fireclay_capture.errors import ObservedException, Unsupported
from fireclay_capture.interpreter.frame import BreakSnapshot
from fireclay_capture.liveness import live_locals
from fireclay_capture.outputs import output_spec, rebuild, replay_of
from fireclay_capture.resume import (
    ITER_SLOT,
    NULL_SLOT,
    VALUE_SLOT,
    enclosing_handlers,
    is_stack_arg,
    resume_code_for,
    trampoline_code_for,
)
from fireclay_capture.variables.base import NULL, CellVar, Var
from fireclay_capture.variables.containers import DictVar, IteratorVar, ListVar, SetVar
from fireclay_capture.variables.functions import RestoreGradMode  # noqa: F401 - re-exported
from fireclay_capture.variables.objects import ModelOutputVar, NewObjectVar

# How many resume functions the running thread is inside: state of the compiled code as it runs
# (one call chain per thread), not of a trace, which never reads it.
_RESUME_DEPTH = threading.local()
# Values whose state lives on the Var itself, so that a Var made after a snapshot is an object
# made after it (an OwnedObjectVar, by contrast, is a new view of a real object that may be older).
_OWN_STATE = (ListVar, DictVar, SetVar, NewObjectVar, ModelOutputVar)
_BRANCHES = {"POP_JUMP_IF_TRUE": True, "POP_JUMP_FORWARD_IF_TRUE": True, "POP_JUMP_BACKWARD_IF_TRUE": True,
             "POP_JUMP_IF_FALSE": False, "POP_JUMP_FORWARD_IF_FALSE": False,
             "POP_JUMP_BACKWARD_IF_FALSE": False}


@dataclass(kw_only=True)
class BreakPlan:
    """What a cache entry ending in a graph break does after its graph."""

    opname: str
    arg: Any  # CALL: argument count; branches: jump target; stores: the name
    kw_names: tuple[str, ...]
    stack: list  # specs of the stack entries (NULL for the interpreter's NULLs)
    iters: frozenset[int]  # stack positions holding a for-loop's iterator
    local_names: tuple[str, ...]
    locals: list  # specs, in local_names order
    next_offset: int
    reason: str
    location: dict | None
    grad_enabled: bool = True  # the grad mode at the break (inside a no_grad block: False)
    resumes: dict = field(default_factory=dict)  # (offset, layout) -> captured resume function
    replay: Any = None  # side_effects.Replay of the changes made before the break
    offset: int = -1  # the break instruction's
    in_region: bool = False  # inside a try or with block of the function
    trampoline: Any = None  # the function made from trampoline_code_for, once built

    def uses_trampoline(self) -> bool:
        return self.in_region or self.opname == "BEFORE_WITH"


class _Shared:
    """A mutable container made during the trace: rebuilt once per run, so that the stack and
    the locals share it as they did in the frame."""

    def __init__(self, slot: int, spec: Any):
        self.slot, self.spec = slot, spec


class _BreakSpecs:
    """Specs of the values live across one graph break (``BreakSpecs``): each value describes
    itself (``Var.reconstruct``); the graph outputs, the shared containers and the cells they
    need are kept here, so that a value reached twice is rebuilt as one object."""

    def __init__(self, tx):
        self.graph, self.shapes = tx.graph, tx.shapes
        self.memo: dict = {}  # output_spec's: an object reached twice is one spec, so one object
        self.containers: dict[int, _Shared] = {}
        self.cells: dict[int, tuple] = {}

    def spec_of(self, value: Var) -> Any:
        return NULL if value is NULL else value.reconstruct(self)

    def output(self, value: Var) -> Any:
        return output_spec(self.graph, value, self.shapes, self.memo)

    def shared(self, value: Var, build) -> Any:
        known = self.containers.get(id(value))
        if known is None:
            known = self.containers[id(value)] = _Shared(len(self.containers), None)
            known.spec = build()
        return known

    def cell(self, cell: CellVar) -> Any:
        if cell.real_cell is not None:
            if cell.source is None:
                raise Unsupported("a closure cell the capture cannot re-read is live across a graph break")
            return ("source", cell.source)  # a real cell; a write to it is replayed
        if id(cell) not in self.cells:
            self.cells[id(cell)] = ("cell", None if cell.contents is NULL else self.spec_of(cell.contents))
        return self.cells[id(cell)]


@dataclass(kw_only=True)
class _FrameSpecs:
    """The root frame's state at a break, as specs: what the resume function is called with."""

    stack: list  # one spec per stack entry (NULL for the interpreter's NULLs)
    iters: frozenset[int]  # stack positions holding a for-loop's iterator
    local_names: tuple[str, ...]
    locals: list  # specs, in local_names order, then one per cell of the frame


def plan_break(tx, frame, e: Unsupported) -> BreakPlan:
    """Turn the root frame's state before its failing instruction into graph outputs and a plan;
    raises Unsupported when this break cannot be resumed (the caller then runs eagerly)."""
    _check_not_raised(e)                          # the user's exception: the frame runs eagerly
    snap = _snapshot_at(frame)                    # the state before the failing instruction
    _check_resumable(tx, frame.code, snap)        # no generator, no callee changes left behind
    _rewind(tx, snap)                             # forget what a callee recorded before it broke
    specs = _BreakSpecs(tx)
    state = _frame_specs(specs, frame, snap)      # stack, live locals and cells as graph outputs
    plan = _plan(tx, frame, snap, state, e)
    plan.replay = replay_of(tx.side_effects, specs.spec_of)  # outside changes, after the locals
    _build_resume_code(plan, frame.code)          # if it cannot be built, the function runs eagerly
    return plan


def _check_not_raised(e: Unsupported) -> None:
    """An exception of the user's code that leaves the root is not a place to split: what led to
    it was traced with ``is_compiling()`` true, and eager may take another path (transformers'
    compile path subscripts a mask its eager path builds, SwitchTransformers). The whole frame
    runs eagerly instead, its callees captured on their own, as TorchDynamo skips such a frame."""
    if isinstance(e, ObservedException) and e.certain:
        raise Unsupported("an exception of the traced code leaves the function")


def _snapshot_at(frame) -> BreakSnapshot:
    snap = frame.before_break
    if snap is None or snap.inst is not frame.inst:
        raise Unsupported(f"cannot resume after {frame.inst.opname if frame.inst else 'the start'}")
    return snap


def _check_resumable(tx, code: types.CodeType, snap: BreakSnapshot) -> None:
    if suspends(code):
        raise Unsupported("graph breaks in generators and coroutines (the function runs eagerly)")
    if any(not _made_by_the_call(v, snap) for v in tx.mutated[snap.mutations:]):
        raise Unsupported("a called function changed lists, dicts or objects of the caller before "
                          "its graph break")
    if len(tx.entered_contexts) != snap.n_contexts:
        raise Unsupported("a graph break inside a context manager entered by a called function")


def _made_by_the_call(var, snap: BreakSnapshot) -> bool:
    """Whether a change the broken call made touched only state the call itself created: a
    list, dict, set, object or closure cell made after the snapshot (Reformer's and ViLT's
    embeddings assign variables their inner functions close over; VITS's encoder appends to
    its own lists). Those are made again when the call runs for real; the caller cannot see
    them, as anything it can see existed before the call, and storing a new value into such an
    object is itself a change the caller sees. A value standing for a real object (a real cell,
    an owned copy, anything with a source) changes that object, which may be older."""
    if var is None or var.source is not None or var.born <= snap.vars_made:
        return False
    if isinstance(var, CellVar):
        return var.real_cell is None
    return isinstance(var, _OWN_STATE)


def _rewind(tx, snap: BreakSnapshot) -> None:
    """A callee that broke runs again, for real, as the break's call: drop its nodes and changes."""
    for node in reversed(tx.graph.nodes[snap.n_nodes:]):
        tx.graph.erase(node)
    tx.side_effects.restore(snap.effects)
    torch.set_grad_enabled(snap.grad_enabled)


def _frame_specs(specs: _BreakSpecs, frame, snap: BreakSnapshot) -> _FrameSpecs:
    code = frame.code
    # A for-loop's iterator crosses the break as the tuple of its remaining items.
    stack = snap.stack
    iters = frozenset(i for i, v in enumerate(stack) if isinstance(v, IteratorVar))
    stack_specs = [("seq", tuple, [specs.spec_of(x) for x in v.items[snap.iter_positions.get(i, v.pos):]])
                   if isinstance(v, IteratorVar) else specs.spec_of(v) for i, v in enumerate(stack)]
    # The stack parameters of a resume function are dead once its prologue has run.
    # Only locals that the rest of the function may read cross the break: a dead one is neither
    # a graph output nor an argument of the resume function, so it is freed as eagerly.
    live = live_locals(code, snap.inst.offset)
    local_names = tuple(n for n in code.co_varnames if n in frame.locals and not is_stack_arg(n)
                        and (live is None or n in live))
    local_specs = [specs.spec_of(frame.locals[n]) for n in local_names]
    # Then every cell of the frame, as the resume function's cell parameters.
    local_specs += [specs.cell(frame.cells[n]) if n in frame.cells else ("cell", None) for n in code.co_cellvars]
    return _FrameSpecs(stack=stack_specs, iters=iters, local_names=local_names, locals=local_specs)


def _plan(tx, frame, snap: BreakSnapshot, state: _FrameSpecs, e: Unsupported) -> BreakPlan:
    inst = snap.inst
    arg = inst.argval if inst.opname in _BRANCHES or inst.opname.startswith(("STORE", "DELETE")) else inst.arg
    return BreakPlan(
        opname=inst.opname, arg=arg, kw_names=tuple(snap.kw_names), stack=state.stack, iters=state.iters,
        local_names=state.local_names, locals=state.locals, next_offset=_next_offset(frame),
        reason=e.reason, location=e.location or tx.location(frame), grad_enabled=snap.grad_enabled,
        offset=inst.offset,
        # Inside a try or with block, the break instruction runs in a trampoline that keeps the
        # function's own handlers around it (see run_break).
        in_region=bool(enclosing_handlers(frame.code, inst.offset)))


def _build_resume_code(plan: BreakPlan, code: types.CodeType) -> None:
    for offset in resume_offsets(plan):
        resume_code_for(code, offset, resume_layout(plan), plan.local_names)
    if plan.uses_trampoline():
        _trampoline_code(plan, code)


def _stack_layout(plan: BreakPlan) -> tuple[str, ...]:
    return tuple(NULL_SLOT if s is NULL else ITER_SLOT if i in plan.iters else VALUE_SLOT
                 for i, s in enumerate(plan.stack))


def _trampoline_code(plan: BreakPlan, code):
    jump = plan.arg if plan.opname in _BRANCHES else None
    return trampoline_code_for(code, plan.offset, _stack_layout(plan), plan.local_names, resume_layout(plan),
                               plan.next_offset, jump)


def _next_offset(frame) -> int:
    return frame.instructions[frame.offsets[frame.inst.offset] + 1].offset


def _realize(spec: Any, results, L: dict, made: dict) -> Any:
    if spec is NULL:
        return NULL
    if isinstance(spec, _Shared):
        if spec.slot not in made:
            made[spec.slot] = _realize(spec.spec, results, L, made)
        return made[spec.slot]
    kind = spec[0]
    # Containers are rebuilt from their realized items, so that shared lists and dicts nested at
    # any depth come out as the same objects; rebuild() then applies the container's class.
    if kind == "object" or (kind == "seq" and spec[1] is list) or kind == "dict":
        # One spec is one object, however many places reach it (specs live as long as the plan).
        key = ("spec", id(spec))
        if key not in made:
            if kind == "object":
                made[key] = obj = spec[1].__new__(spec[1])
                for k, s in spec[2]:
                    object.__setattr__(obj, k, _realize(s, results, L, made))
            elif kind == "seq":
                items: list[Any] = []
                made[key] = items
                items.extend(_realize(s, results, L, made) for s in spec[2])
            else:
                made[key] = spec[1]((k, _realize(s, results, L, made)) for k, s in spec[2])
        return made[key]
    if kind == "seq":
        return rebuild(("seq", spec[1], [("const", _realize(s, results, L, made)) for s in spec[2]]), results, L)
    if kind == "model_output":
        key = ("spec", id(spec))  # one object for the stack and the locals that share it
        if key not in made:
            items = [(k, ("const", _realize(s, results, L, made))) for k, s in spec[2]]
            made[key] = rebuild((kind, spec[1], items), results, L)
        return made[key]
    if kind in ("cell", "function"):
        key = ("spec", id(spec))
        if key not in made:
            if kind == "cell":
                made[key] = types.CellType() if spec[1] is None else types.CellType(_realize(spec[1], results, L, made))
            else:
                _, code, f_globals, defaults, closure = spec
                made[key] = types.FunctionType(code, f_globals, code.co_name,
                                               tuple(_realize(d, results, L, made) for d in defaults) or None,
                                               tuple(_realize(c, results, L, made) for c in closure) or None)
        return made[key]
    if kind == "attr":
        return getattr(_realize(spec[1], results, L, made), spec[2])
    if kind == "method":
        return types.MethodType(_realize(spec[1], results, L, made), _realize(spec[2], results, L, made))
    return rebuild(spec, results, L)


def run_break(plan: BreakPlan, owner, results, L: dict) -> Any:
    """Steps 2-4 of a graph break, after the graph ran: returns the function's result."""
    torch.set_grad_enabled(plan.grad_enabled)
    made: dict = {}
    stack = [_realize(s, results, L, made) for s in plan.stack]
    local_values = [_realize(s, results, L, made) for s in plan.locals]
    if plan.replay is not None:
        plan.replay.apply(plan.replay.prepare(lambda spec: _realize(spec, results, L, made), L))
    # From here on the frame's state lives in `stack` and `local_values` only.
    L.clear()
    results = None
    if plan.uses_trampoline():
        return _run_in_trampoline(plan, owner, stack, local_values)
    # An iterator the break's own instruction consumes (a comprehension's, handed to its code
    # object by CALL 0) is an iterator again, not the tuple of its items it crossed as.
    for i in plan.iters:
        if i >= len(stack) - _consumed(plan):
            stack[i] = iter(stack[i])
    offset = plan.next_offset
    op = plan.opname
    if op in _BRANCHES:
        value = stack.pop()
        if bool(value) == _BRANCHES[op]:
            offset = plan.arg
    elif op == "CALL":
        stack.append(_call_from_stack(stack, plan.arg, plan.kw_names, owner))
    elif op == "CALL_KW":  # 3.13: the keyword names are on the stack
        kw = stack.pop()
        stack.append(_call_from_stack(stack, plan.arg, tuple(kw), owner))
    elif op == "CALL_FUNCTION_EX":
        kwargs = stack.pop() if plan.arg & 1 else {}
        args = stack.pop()
        fn = stack.pop()
        if stack and stack[-1] is NULL:
            stack.pop()
        stack.append(owner.callee(fn)(*args, **kwargs))
    elif op == "STORE_GLOBAL":
        owner.fn.__globals__[plan.arg] = stack.pop()
    elif op == "STORE_ATTR":
        obj = stack.pop()
        setattr(obj, plan.arg, stack.pop())
    elif op == "STORE_SUBSCR":
        key, obj, value = stack.pop(), stack.pop(), stack.pop()
        obj[key] = value
    elif op == "DELETE_SUBSCR":
        key, obj = stack.pop(), stack.pop()
        del obj[key]
    elif op == "BINARY_SUBSCR":
        key, obj = stack.pop(), stack.pop()
        stack.append(obj[key])
    elif op == "BINARY_SLICE":  # 3.12: obj[start:stop] (a bound that is a tensor's data)
        stop, start, obj = stack.pop(), stack.pop(), stack.pop()
        stack.append(obj[start:stop])
    elif op == "STORE_SLICE":
        stop, start, obj, value = stack.pop(), stack.pop(), stack.pop(), stack.pop()
        obj[start:stop] = value
    else:  # pragma: no cover - plan_break only plans the instructions above
        raise AssertionError(op)
    layout = resume_layout(plan)
    args = [v for v in stack if v is not NULL]
    del stack
    return _call_resume(owner.resume_function(plan, offset, layout), args, local_values)


def _call_resume(resume, args: list, local_values: list) -> Any:
    values = args + local_values
    args.clear()
    local_values.clear()
    # Every break nests one more Python call (a loop that breaks on each iteration nests once
    # per iteration): past the limit, the rest of the function runs as plain Python.
    depth = getattr(_RESUME_DEPTH, "depth", 0)
    if depth >= config.max_resume_depth:
        return resume.fn(*values)
    _RESUME_DEPTH.depth = depth + 1
    try:
        return resume.call_with_list(values)  # hands the values over: nothing here keeps them
    finally:
        _RESUME_DEPTH.depth = depth


def _run_in_trampoline(plan: BreakPlan, owner, stack: list, local_values: list) -> Any:
    """Run the break instruction inside the function's own try/with regions: a trampoline code
    object (``resume.trampoline_code_for``) executes it, leaves the regions, and calls back here
    to continue in the resume function (whose code re-enters the regions)."""
    _capture_callee(plan, owner, stack)
    if plan.trampoline is None:
        code = _trampoline_code(plan, owner.fn.__code__)
        plan.trampoline = types.FunctionType(code, owner.fn.__globals__, code.co_name, None, owner.fn.__closure__)
    layout = resume_layout(plan)
    n_stack = sum(kind != NULL_SLOT for kind in layout)

    def then(offset: int, *values: Any) -> Any:
        args = list(values[:n_stack])
        slots = [kind for kind in layout if kind != NULL_SLOT]
        for i, kind in enumerate(slots):
            if kind == ITER_SLOT:  # a live iterator crosses as its remaining items
                args[i] = tuple(args[i])
        return _call_resume(owner.resume_function(plan, offset, layout), args, list(values[n_stack:]))

    args = [v for v in stack if v is not NULL]
    del stack
    return plan.trampoline(*args, *local_values, then)


def _capture_callee(plan: BreakPlan, owner, stack: list) -> None:
    """The function a break's call reaches is captured on its own: put its wrapper on the stack."""
    op = plan.opname
    if op in ("CALL", "CALL_KW"):
        # Two slots sit under the arguments (and CALL_KW's names): NULL then the callable on
        # 3.11/3.12, the callable then NULL on 3.13, or a bound method's function then its self.
        top = len(stack) - plan.arg - (2 if op == "CALL_KW" else 1)
        below = top - 1
        if stack[below] is NULL:
            stack[top] = owner.callee(stack[top])
        else:
            stack[below] = owner.callee(stack[below])
    elif op == "CALL_FUNCTION_EX":
        at = len(stack) - 2 - (plan.arg & 1)
        stack[at] = owner.callee(stack[at])


def _consumed(plan: BreakPlan) -> int:
    """How many stack entries the break's instruction pops."""
    op = plan.opname
    if op == "CALL":
        return plan.arg + 2
    if op == "CALL_KW":
        return plan.arg + 3
    if op == "CALL_FUNCTION_EX":
        n = 2 + (plan.arg & 1)
        return n + 1 if len(plan.stack) > n and plan.stack[-n - 1] is NULL else n
    return {"STORE_GLOBAL": 1, "STORE_ATTR": 2, "STORE_SUBSCR": 3, "DELETE_SUBSCR": 2, "BINARY_SUBSCR": 2,
            "BINARY_SLICE": 3, "STORE_SLICE": 4}.get(op, 1)


def resume_layout(plan: BreakPlan) -> tuple[str, ...]:
    """The stack slots of the resume function: what stays below the instruction, plus its result."""
    untouched = len(plan.stack) - _consumed(plan)
    kinds = [NULL_SLOT if s is NULL else ITER_SLOT if i in plan.iters else VALUE_SLOT
             for i, s in enumerate(plan.stack[:untouched])]
    if plan.opname.startswith("CALL") or plan.opname in ("BINARY_SUBSCR", "BINARY_SLICE"):
        kinds.append(VALUE_SLOT)
    elif plan.opname == "BEFORE_WITH":  # the block's __exit__, and what __enter__ returned
        kinds += [VALUE_SLOT, VALUE_SLOT]
    return tuple(kinds)


def resume_offsets(plan: BreakPlan) -> list[int]:
    return [plan.next_offset, plan.arg] if plan.opname in _BRANCHES else [plan.next_offset]


def _call_from_stack(stack: list, argc: int, kw_names: tuple[str, ...], owner) -> Any:
    args = stack[len(stack) - argc:]
    del stack[len(stack) - argc:]
    top = stack.pop()
    below = stack.pop()
    if below is NULL:
        fn = top
    elif top is NULL:
        fn = below
    else:
        fn, args = below, [top, *args]
    kwargs = {}
    if kw_names:
        kwargs = dict(zip(kw_names, args[len(args) - len(kw_names):]))
        args = args[:len(args) - len(kw_names)]
    return owner.callee(fn)(*args, **kwargs)


__all__ = ["BreakPlan", "RestoreGradMode", "plan_break", "run_break"]
