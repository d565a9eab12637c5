"""Jumps and branches, returns, generators' yields, ``with`` blocks."""

from __future__ import annotations

from fireclay_capture.errors import Unsupported
from fireclay_capture.interpreter.frame import Frame, handler
from fireclay_capture.variables.base import ConstVar
from fireclay_capture.variables.functions import ContextExitVar
from fireclay_capture.variables.objects import NewObjectVar, ObjectVar


@handler("JUMP_FORWARD", "JUMP_BACKWARD", "JUMP_BACKWARD_NO_INTERRUPT", "JUMP", "JUMP_NO_INTERRUPT",
         "JUMP_ABSOLUTE")
def jump(frame: Frame, inst) -> None:
    frame.jump_to(inst.argval)


def _branch(frame: Frame, inst, when: bool) -> None:
    if frame.pop().truth(frame.tx) == when:
        frame.jump_to(inst.argval)


@handler("POP_JUMP_IF_TRUE", "POP_JUMP_FORWARD_IF_TRUE", "POP_JUMP_BACKWARD_IF_TRUE")
def pop_jump_if_true(frame: Frame, inst) -> None:
    _branch(frame, inst, True)


@handler("POP_JUMP_IF_FALSE", "POP_JUMP_FORWARD_IF_FALSE", "POP_JUMP_BACKWARD_IF_FALSE")
def pop_jump_if_false(frame: Frame, inst) -> None:
    _branch(frame, inst, False)


def _is_none(v) -> bool:
    return isinstance(v, ConstVar) and v.value is None


@handler("POP_JUMP_IF_NONE", "POP_JUMP_FORWARD_IF_NONE", "POP_JUMP_BACKWARD_IF_NONE")
def pop_jump_if_none(frame: Frame, inst) -> None:
    if _is_none(frame.pop()):
        frame.jump_to(inst.argval)


@handler("POP_JUMP_IF_NOT_NONE", "POP_JUMP_FORWARD_IF_NOT_NONE", "POP_JUMP_BACKWARD_IF_NOT_NONE")
def pop_jump_if_not_none(frame: Frame, inst) -> None:
    if not _is_none(frame.pop()):
        frame.jump_to(inst.argval)


@handler("JUMP_IF_TRUE_OR_POP")
def jump_if_true_or_pop(frame: Frame, inst) -> None:
    if frame.stack[-1].truth(frame.tx):
        frame.jump_to(inst.argval)
    else:
        frame.pop()


@handler("JUMP_IF_FALSE_OR_POP")
def jump_if_false_or_pop(frame: Frame, inst) -> None:
    if not frame.stack[-1].truth(frame.tx):
        frame.jump_to(inst.argval)
    else:
        frame.pop()


@handler("RETURN_VALUE")
def return_value(frame: Frame, inst) -> None:
    frame.do_return(frame.pop())


@handler("RETURN_CONST")
def return_const(frame: Frame, inst) -> None:
    frame.do_return(ConstVar(frame.code.co_consts[inst.arg]))


@handler("RETURN_GENERATOR")
def return_generator(frame: Frame, inst) -> None:
    if frame.yielded is None:
        raise Unsupported("a generator outside an iteration the capture can unroll")
    frame.push(ConstVar(None))  # what the first resumption receives, popped right away


@handler("YIELD_VALUE")
def yield_value(frame: Frame, inst) -> None:
    if frame.yielded is None:
        raise Unsupported("yield outside a generator the capture can unroll")
    frame.yielded.append(frame.pop())
    frame.push(ConstVar(None))  # the value `send` would deliver


@handler("BEFORE_WITH")
def before_with(frame: Frame, inst) -> None:
    ctx = frame.pop()
    enter = getattr(ctx, "enter", None)
    if enter is None and isinstance(ctx, (ObjectVar, NewObjectVar)):
        # A user context manager: its __enter__ and __exit__ are inlined like any method.
        exit_method = ctx.getattr(frame.tx, "__exit__")
        entered = ctx.getattr(frame.tx, "__enter__").call(frame.tx, [], {})
        frame.push(exit_method)
        frame.push(entered)
        return
    if enter is None:
        raise Unsupported(f"`with` on {ctx}; only torch.no_grad(), torch.enable_grad(), "
                          "torch.set_grad_enabled() and nullcontext() are supported")
    frame.push(ContextExitVar(ctx))
    frame.push(enter(frame.tx))


@handler("CLEANUP_THROW", "SETUP_FINALLY", "SETUP_WITH", "SETUP_CLEANUP", "PREP_RERAISE_STAR",
         "CHECK_EG_MATCH")
def exception_path(frame: Frame, inst) -> None:
    raise Unsupported(f"exception handling ({inst.opname})")
