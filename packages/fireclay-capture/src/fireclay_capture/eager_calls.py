"""Eager frames whose callees are still captured.

When the capture gives up on a function (an exception of the traced code leaves it, a break it
cannot split at), the function runs eagerly. TorchDynamo's frame hook stays on for the frames
such a skipped frame calls, so they are captured on their own. With no frame hook, the same is
done here at the call sites: ``calling_through(fn, hooks)`` is ``fn`` with a copy of its code in
which every call whose layout is known passes its callable through a hook first
(``CallHooks.call`` / ``call_ex``; the hook returns the captured callee, see
``CapturedFunction.callee``).

The rewrite, per call site (3.11/3.12 lay a call out as ``NULL, callable, *args``; 3.13 as
``callable, NULL, *args``)::

    BUILD_TUPLE n; LOAD_CONST kw_names; LOAD_CONST hook; SWAP...  ->  hook(callable, args, kw_names)

Method loads (``LOAD_METHOD``, ``LOAD_ATTR`` with its method bit) become an attribute load and a
NULL, so that method calls (``self.encoder(...)``) have the plain layout too. Which calls have it
is found by following the value stack through the code, marking the slots a NULL was pushed to;
a call whose layout is not known (a comprehension's ``MAKE_FUNCTION; GET_ITER; CALL 0``, code in
exception handlers) is left as it is. Nested code objects (comprehensions, inner functions) are
not rewritten.
"""

from __future__ import annotations

import dis
import types
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from bytecode import Bytecode, Instr, Label, TryBegin

from fireclay_capture import bytecode_versions as versions
from fireclay_capture.code_flags import suspends

_NULL, _VALUE, _OWN_FRAME = "null", "value", "own frame"
# Builtins that read the frame calling them (zero-argument super(), locals()...): a call through
# the hook would hand them the hook's frame, so such calls are left as they are.
_READS_CALLER_FRAME = frozenset({"super", "locals", "vars", "dir", "eval", "exec", "globals", "breakpoint"})
_ENDS_FLOW = frozenset({"RETURN_VALUE", "RETURN_CONST", "RAISE_VARARGS", "RERAISE", "JUMP_FORWARD", "JUMP_BACKWARD",
                        "JUMP_ABSOLUTE", "JUMP", "JUMP_NO_INTERRUPT", "JUMP_BACKWARD_NO_INTERRUPT"})


@dataclass(frozen=True, kw_only=True)
class CallHooks:
    """What a rewritten call runs instead: ``callee(fn)`` gives the callable to call."""

    callee: Callable[[Any], Any]

    def call(self, fn: Any, args: tuple, kw_names: tuple[str, ...]) -> Any:
        fn = self.callee(fn)
        if kw_names:
            k = len(kw_names)
            return fn(*args[:-k], **dict(zip(kw_names, args[-k:])))
        return fn(*args)

    def call_ex(self, fn: Any, args: Any, kwargs: Any) -> Any:
        return self.callee(fn)(*args, **(kwargs if kwargs is not None else {}))


def calling_through(fn: types.FunctionType, hooks: CallHooks) -> types.FunctionType | None:
    """``fn`` with its calls passing through ``hooks``; None where its code is not rewritten
    (generators and coroutines, code the rewrite does not follow)."""
    code = _rewritten(fn.__code__, hooks)
    if code is None:
        return None
    made = types.FunctionType(code, fn.__globals__, fn.__name__, fn.__defaults__, fn.__closure__)
    made.__kwdefaults__ = fn.__kwdefaults__
    made.__qualname__ = fn.__qualname__
    return made


def _rewritten(code: types.CodeType, hooks: CallHooks) -> types.CodeType | None:
    if suspends(code):
        return None
    try:
        original = Bytecode.from_code(code)
        plain = _call_layouts(original, code)
        if plain is None:
            return None
        # Handler depths come from the code's own exception table, not from a flow analysis: a
        # resume function's prologue jumps past the start of the region it enters (resume.py).
        begins = [x for x in original if isinstance(x, TryBegin)]
        entries = _exception_entries(code)
        if len(begins) != len(entries):
            return None
        for begin, entry in zip(begins, entries):
            begin.stack_depth = entry.depth
            begin.push_lasti = entry.lasti
        items = _rewrite(original, plain, hooks)
        original.clear()  # the same Bytecode keeps the code's names, flags and arguments
        original.extend(items)
        # A rewritten call holds at most three more values than the call it replaces.
        return original.to_code(stacksize=code.co_stacksize + 3, compute_exception_stack_depths=False)
    except Exception:  # code the rewrite does not follow runs as it is
        return None


def _is_method_load(inst: Instr) -> bool:
    if inst.name == "LOAD_METHOD":
        return True
    return versions.LOAD_ATTR_HAS_METHOD_BIT and inst.name == "LOAD_ATTR" and isinstance(inst.arg, tuple) \
        and bool(inst.arg[0])


def _pushes_null_first(inst: Instr) -> bool:
    """LOAD_GLOBAL with its NULL bit: NULL below the global on 3.11/3.12, above it on 3.13."""
    return inst.name == "LOAD_GLOBAL" and isinstance(inst.arg, tuple) and bool(inst.arg[0])


def _call_layouts(code: Bytecode, code_object: types.CodeType) -> set[int] | None:
    """Indexes (into ``code``) of the calls whose callable slot is known to sit on a NULL, after
    method loads are rewritten; None if the code holds something this does not follow."""
    items = list(code)
    labels = {id(x): i for i, x in enumerate(items) if isinstance(x, Label)}
    depths = _try_depths(code, code_object)
    if depths is None:
        return None
    states: dict[int, tuple[str, ...]] = {0: ()}
    work = [0]
    plain: set[int] = set()
    seen_steps = 0
    while work:
        i = work.pop()
        stack = list(states[i])
        while i < len(items):
            seen_steps += 1
            if seen_steps > 200_000:
                return None
            x = items[i]
            if isinstance(x, Instr):
                if x.name == "LOAD_SUPER_ATTR":
                    return None  # its method form is not rewritten: leave the whole function
                jump_target = labels.get(id(x.arg)) if isinstance(x.arg, Label) else None
                if jump_target is not None:
                    after_jump = _step(x, stack[:], plain, i, jump=True)
                    if after_jump is None:
                        return None
                    if _merge(states, jump_target, after_jump):
                        work.append(jump_target)
                if x.name in _ENDS_FLOW:
                    break
                after = _step(x, stack, plain, i, jump=False)
                if after is None:
                    return None
                stack = after
            elif isinstance(x, TryBegin):
                # The handler starts from the stack cut to the region's depth, then the offset of
                # the raising instruction (lasti) and the exception.
                depth = depths[id(x)]
                if len(stack) < depth:
                    return None
                handler = tuple(stack[:depth]) + (_VALUE,) * (1 + bool(x.push_lasti))
                target = labels[id(x.target)]
                if _merge(states, target, handler):
                    work.append(target)
            i += 1
            if i < len(items) and isinstance(items[i], Label):
                if not _merge(states, i, tuple(stack)):
                    break  # already followed from here with a stack at least as general
                stack = list(states[i])
    return plain


def _try_depths(code: Bytecode, code_object: types.CodeType) -> dict[int, int] | None:
    """The stack depth of each try region's handler, from the code's exception table (the
    ``bytecode`` package leaves it unset until it assembles the code)."""
    begins = [x for x in code if isinstance(x, TryBegin)]
    entries = _exception_entries(code_object)
    if len(begins) != len(entries):
        return None
    return {id(b): e.depth for b, e in zip(begins, entries)}


def _exception_entries(code_object: types.CodeType) -> list:
    return sorted(dis.Bytecode(code_object).exception_entries,  # type: ignore[attr-defined]  # 3.11+
                  key=lambda e: e.start)


def _merge(states: dict, at: int, stack: Sequence[str]) -> bool:
    """Record the stack reaching ``at``; True when ``at`` must be followed (again)."""
    known = states.get(at)
    if known is None:
        states[at] = tuple(stack)
        return True
    if known != tuple(stack):
        # Two paths disagree on where NULLs are: forget them (calls there are left alone).
        merged = tuple(a if a == b else _VALUE for a, b in zip(known, stack)) if len(known) == len(stack) else None
        if merged is None:
            raise ValueError("stack depths differ")
        if merged != known:
            states[at] = merged
            return True
    return False


def _step(inst: Instr, stack: list[str], plain: set[int], index: int, jump: bool) -> list[str] | None:
    name = inst.name
    if name == "PUSH_NULL":
        return [*stack, _NULL]
    if _pushes_null_first(inst):
        loaded = _OWN_FRAME if inst.arg[1] in _READS_CALLER_FRAME else _VALUE
        return [*stack, loaded, _NULL] if versions.NULL_AFTER_CALLABLE else [*stack, _NULL, loaded]
    if _is_method_load(inst):  # rewritten: attribute, then a NULL on its side
        return [*stack[:-1], _VALUE, _NULL] if versions.NULL_AFTER_CALLABLE else [*stack[:-1], _NULL, _VALUE]
    if name == "PRECALL":  # 3.11: dis counts the call's pops here; they are counted at CALL below
        return stack
    if name == "SWAP":
        stack[-1], stack[-inst.arg] = stack[-inst.arg], stack[-1]
        return stack
    if name == "COPY":
        return [*stack, stack[-inst.arg]]
    if name == "CALL":
        n = inst.arg
        null_at = -(n + 1) if versions.NULL_AFTER_CALLABLE else -(n + 2)
        callable_at = -(n + 2) if versions.NULL_AFTER_CALLABLE else -(n + 1)
        if len(stack) >= n + 2 and stack[null_at] == _NULL and stack[callable_at] == _VALUE:
            plain.add(index)
        return [*stack[:len(stack) - n - 2], _VALUE]
    if name == "CALL_FUNCTION_EX":
        n = 2 + (inst.arg & 1)
        null_at = -(n) if versions.NULL_AFTER_CALLABLE else -(n + 1)
        callable_at = -(n + 1) if versions.NULL_AFTER_CALLABLE else -n
        if len(stack) >= n + 1 and stack[null_at] == _NULL and stack[callable_at] == _VALUE:
            plain.add(index)
        return [*stack[:len(stack) - n - 1], _VALUE]
    if name == "CALL_KW":  # 3.13, left as it is
        return [*stack[:len(stack) - inst.arg - 3], _VALUE]
    effect = inst.stack_effect(jump=jump)
    if effect < 0:
        if -effect > len(stack):
            raise ValueError("stack underflow")
        del stack[len(stack) + effect:]
        return stack
    return stack + [_VALUE] * effect


def _rewrite(code: Bytecode, plain: set[int], hooks: CallHooks) -> list:
    items = list(code)
    out: list = []
    for i, x in enumerate(items):
        if not isinstance(x, Instr):
            out.append(x)
            continue
        loc = x.location
        if _is_method_load(x):
            name = x.arg if x.name == "LOAD_METHOD" else x.arg[1]
            out.append(Instr("LOAD_ATTR", (False, name) if versions.LOAD_ATTR_HAS_METHOD_BIT else name, location=loc))
            out.append(Instr("PUSH_NULL", location=loc))
            if not versions.NULL_AFTER_CALLABLE:
                out.append(Instr("SWAP", 2, location=loc))
            continue
        if i not in plain:
            out.append(x)
            continue
        if x.name == "CALL":
            kw_names: tuple = ()
            # Drop what announced the call (3.11's PRECALL, 3.11/3.12's KW_NAMES): the hook's
            # own call is announced below.
            while out and isinstance(out[-1], Instr) and out[-1].name in ("PRECALL", "KW_NAMES"):
                dropped = out.pop()
                if dropped.name == "KW_NAMES":
                    kw_names = tuple(dropped.arg)
            out.append(Instr("BUILD_TUPLE", x.arg, location=loc))
            out.append(Instr("LOAD_CONST", kw_names, location=loc))
            hook: Callable[..., Any] = hooks.call
        else:  # CALL_FUNCTION_EX
            if not x.arg & 1:
                out.append(Instr("LOAD_CONST", None, location=loc))
            hook = hooks.call_ex
        # NULL, fn, args, third  ->  NULL, hook, fn, args, third  (3.13: fn, NULL, ... -> hook, NULL, fn, ...)
        out.append(Instr("LOAD_CONST", hook, location=loc))
        out.append(Instr("SWAP", 5 if versions.NULL_AFTER_CALLABLE else 4, location=loc))
        out.append(Instr("SWAP", 3, location=loc))
        out.append(Instr("SWAP", 2, location=loc))
        if versions.HAS_PRECALL:
            out.append(Instr("PRECALL", 3, location=loc))
        out.append(Instr("CALL", 3, location=loc))
    return out


__all__ = ["CallHooks", "calling_through"]
