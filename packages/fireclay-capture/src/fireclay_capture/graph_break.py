"""Graph breaks: split a function at an instruction the capture cannot trace.

When the root frame stops at a call, a branch or a store it cannot trace, the graph captured up
to that instruction becomes a cache entry whose outputs are the tensors the rest of the function
needs (the value stack and the live locals). Running that entry means:

1. the compiled graph runs, attribute writes are replayed;
2. the stack entries and locals are rebuilt as Python objects around the graph's results;
3. the instruction runs in plain Python (a call to a Python function is wrapped so that the
   callee is captured on its own);
4. a *resume function* (``resume.py``), captured like any function, continues from the
   instruction after the break (from the jump target, for a branch that jumps).

A break inside an inlined call splits the root frame at the call that reached it: the nodes the
callee recorded are dropped, and the callee runs (captured on its own) as the break's call.
"""

from __future__ import annotations

import threading
import types
from dataclasses import dataclass, field
from typing import Any

import torch

from fireclay_capture import config
from fireclay_capture.errors import Unsupported
from fireclay_capture.outputs import output_spec, rebuild
from fireclay_capture.resume import (
    ITER_SLOT,
    NULL_SLOT,
    VALUE_SLOT,
    enclosing_handlers,
    is_stack_arg,
    resume_code_for,
)
from fireclay_capture.variables.base import MUTATIONS, NULL, ConstMethodVar, ConstVar, Var
from fireclay_capture.variables.containers import ContainerMethodVar, DictVar, IteratorVar, ListVar, TupleVar
from fireclay_capture.variables.functions import (
    BuiltinMethodVar,
    BuiltinVar,
    ContextExitVar,
    GradModeVar,
    UserFunctionVar,
    UserMethodVar,
)
from fireclay_capture.variables.tensor import TensorMethodVar, TensorVar, TorchFnVar

_NESTING = threading.local()
_BRANCHES = {"POP_JUMP_IF_TRUE": True, "POP_JUMP_FORWARD_IF_TRUE": True, "POP_JUMP_BACKWARD_IF_TRUE": True,
             "POP_JUMP_IF_FALSE": False, "POP_JUMP_FORWARD_IF_FALSE": False,
             "POP_JUMP_BACKWARD_IF_FALSE": False}


@dataclass
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


class RestoreGradMode:
    """The ``__exit__`` of a grad-mode ``with`` block that a graph break cut in two: the resume
    function calls it where the block ends, and it restores the mode from before the block."""

    def __init__(self, prior: bool):
        self.prior = prior

    def __call__(self, exc_type=None, exc=None, tb=None) -> None:
        torch.set_grad_enabled(self.prior)


class _Shared:
    """A mutable container made during the trace: rebuilt once per run, so that the stack and
    the locals share it as they did in the frame."""

    def __init__(self, slot: int, spec: Any):
        self.slot, self.spec = slot, spec


def plan_break(tx, frame, e: Unsupported) -> BreakPlan:
    """Turn the root frame's state before its failing instruction into graph outputs and a plan;
    raises Unsupported when this break cannot be resumed (the caller then runs eagerly)."""
    snap = frame.before_break
    if snap is None or snap[0] is not frame.inst:
        raise Unsupported(f"cannot resume after {frame.inst.opname if frame.inst else 'the start'}")
    inst, stack, kw_names, n_nodes, attr_writes, grad, n_contexts, mutations = snap
    code = frame.code
    if code.co_flags & 0x20 or code.co_flags & 0x100 or code.co_flags & 0x80 or code.co_flags & 0x200:
        raise Unsupported("graph breaks in generators and coroutines (the function runs eagerly)")
    handlers = enclosing_handlers(code, inst.offset)
    exits = [v for v in stack if isinstance(v, ContextExitVar)]
    if "try" in handlers:
        raise Unsupported("a graph break inside a try block (the function runs eagerly)")
    if len(exits) != len(handlers) or not all(isinstance(v.ctx, GradModeVar) for v in exits):
        raise Unsupported("a graph break inside a with block other than a grad-mode one "
                          "(the function runs eagerly)")
    if MUTATIONS[0] != mutations:
        raise Unsupported("a called function changed lists, dicts or objects of the caller before "
                          "its graph break")
    if len(tx.entered_contexts) != n_contexts:
        raise Unsupported("a graph break inside a context manager entered by a called function")
    # Forget what a callee recorded before it broke: it runs again, for real, as the break's call.
    for node in reversed(tx.graph.nodes[n_nodes:]):
        tx.graph.erase(node)
    tx.attr_writes = attr_writes
    torch.set_grad_enabled(grad)

    graph = tx.graph
    shared: dict[int, _Shared] = {}

    def spec_of(v: Var) -> Any:
        if v is NULL:
            return NULL
        if isinstance(v, (ListVar, DictVar, TupleVar)) and v.source is not None and not getattr(v, "fresh", False):
            return ("source", v.source)  # the caller's own container (mutating it ends a trace)
        if isinstance(v, (ListVar, DictVar)) and not (v.source is not None and not getattr(v, "fresh", False)):
            known = shared.get(id(v))
            if known is None:
                known = shared[id(v)] = _Shared(len(shared), None)
                if isinstance(v, ListVar):
                    known.spec = ("seq", list, [spec_of(i) for i in v.items])
                else:
                    if v.key_vars:
                        raise Unsupported("a dict keyed by objects is live across a graph break")
                    known.spec = ("dict", v.cls, [(k, spec_of(x)) for k, x in v.items.items()])
            return known
        if isinstance(v, TupleVar) and v.source is None:
            return ("seq", v.cls, [spec_of(i) for i in v.items])
        if isinstance(v, IteratorVar):
            raise Unsupported("an iterator kept in a variable is live across a graph break")
        if isinstance(v, (TensorVar, ConstVar)) or v.source is not None:
            return output_spec(graph, v, tx.shapes)
        if isinstance(v, ContextExitVar):  # the grad-mode block's exit, re-entered by the resume
            return ("const", RestoreGradMode(v.ctx.prior))
        if isinstance(v, BuiltinVar):
            return ("const", v.fn)
        if isinstance(v, TorchFnVar):
            return ("const", v.fn)
        if isinstance(v, UserFunctionVar):
            return ("const", v.fn)
        if isinstance(v, TensorMethodVar):
            return ("attr", spec_of(v.tensor), v.name)
        if isinstance(v, ConstMethodVar):
            return ("const", getattr(v.owner.value, v.name))
        if isinstance(v, BuiltinMethodVar):
            return ("const", getattr(v.owner, v.name))
        if isinstance(v, ContainerMethodVar):
            return ("attr", spec_of(v.owner), v.name)
        if isinstance(v, UserMethodVar):
            return ("method", spec_of(v.fn), spec_of(v.self_var))
        return output_spec(graph, v, tx.shapes)  # objects made in the trace, ModelOutputs; or raises

    # A for-loop's iterator crosses the break as the tuple of its remaining items.
    iters = frozenset(i for i, v in enumerate(stack) if isinstance(v, IteratorVar))
    stack_specs = [("seq", tuple, [spec_of(i) for i in v.items[v.pos:]]) if isinstance(v, IteratorVar)
                   else spec_of(v) for v in stack]
    # The stack parameters of a resume function are dead once its prologue has run.
    local_names = tuple(n for n in code.co_varnames if n in frame.locals and not is_stack_arg(n))
    local_specs = [spec_of(frame.locals[n]) for n in local_names]
    for n in local_names:
        if isinstance(frame.locals[n], IteratorVar):
            raise Unsupported("an iterator kept in a variable is live across a graph break")
    arg = inst.argval if inst.opname in _BRANCHES or inst.opname.startswith(("STORE", "DELETE")) else inst.arg
    plan = BreakPlan(inst.opname, arg, tuple(kw_names), stack_specs, iters, local_names, local_specs,
                     _next_offset(frame), e.reason, e.location or tx.location(frame), grad)
    # Build the resume code now: if it cannot be built, the function runs eagerly instead.
    for offset in resume_offsets(plan):
        resume_code_for(code, offset, resume_layout(plan), local_names)
    return plan


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
    if kind == "seq":
        return rebuild(("seq", spec[1], [("const", _realize(s, results, L, made)) for s in spec[2]]), results, L)
    if kind in ("dict", "model_output", "object"):
        items = [(k, ("const", _realize(s, results, L, made))) for k, s in spec[2]]
        return rebuild((kind, spec[1], items), results, L)
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
    else:  # pragma: no cover - plan_break only plans the instructions above
        raise AssertionError(op)
    layout = resume_layout(plan)
    args = [v for v in stack if v is not NULL]
    resume = owner.resume_function(plan, offset, layout)
    # Every break nests one more Python call (a loop that breaks on each iteration nests once
    # per iteration): past the limit, the rest of the function runs as plain Python.
    depth = getattr(_NESTING, "depth", 0)
    if depth >= config.max_resume_depth:
        return resume.fn(*args, *local_values)
    _NESTING.depth = depth + 1
    try:
        return resume(*args, *local_values)
    finally:
        _NESTING.depth = depth


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
    return {"STORE_GLOBAL": 1, "STORE_ATTR": 2, "STORE_SUBSCR": 3, "DELETE_SUBSCR": 2}.get(op, 1)


def resume_layout(plan: BreakPlan) -> tuple[str, ...]:
    """The stack slots of the resume function: what stays below the instruction, plus its result."""
    untouched = len(plan.stack) - _consumed(plan)
    kinds = [NULL_SLOT if s is NULL else ITER_SLOT if i in plan.iters else VALUE_SLOT
             for i, s in enumerate(plan.stack[:untouched])]
    if plan.opname.startswith("CALL"):
        kinds.append(VALUE_SLOT)
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
