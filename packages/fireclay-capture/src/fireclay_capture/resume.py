"""Resume functions: new code objects that continue a function from the middle.

After a graph break the graph captured so far has run and the unsupported instruction has run in
plain Python; what is left of the function runs as a *resume function*. It is the original code
with a short prologue: its parameters are the value-stack entries and the live locals at the
break, it pushes the stack entries back (``PUSH_NULL`` where the interpreter had a NULL,
``GET_ITER`` over the remaining items of a ``for`` loop's iterator) and jumps to the resume
offset. The rest of the original bytecode is kept whole, so that loops can jump back and every
later instruction keeps its line number. Built with the ``bytecode`` package.
"""

from __future__ import annotations

import dis
import types

from bytecode import Bytecode, Instr, Label

from fireclay_capture.errors import Unsupported

CO_VARARGS = 0x04
CO_VARKEYWORDS = 0x08

#: What each stack slot holds when the resume function starts.
NULL_SLOT, VALUE_SLOT, ITER_SLOT = "null", "value", "iter"

_RESUME_CODES: dict[tuple, types.CodeType] = {}


def enclosing_handlers(code: types.CodeType, offset: int) -> list[str]:
    """The try/with regions around ``offset``: "with" for a with-block, "try" for the rest."""
    insts = list(dis.get_instructions(code))
    by_offset = {inst.offset: i for i, inst in enumerate(insts)}
    kinds = []
    for e in dis.Bytecode(code).exception_entries:
        if e.start <= offset < e.end:
            handler = insts[by_offset[e.target]:by_offset[e.target] + 3]
            kinds.append("with" if any(i.opname == "WITH_EXCEPT_START" for i in handler) else "try")
    return kinds


def stack_arg_name(i: int) -> str:
    return f"___stack{i}"


def is_stack_arg(name: str) -> bool:
    return name.startswith("___stack")


def resume_code_for(code: types.CodeType, offset: int, layout: tuple[str, ...],
                    local_names: tuple[str, ...]) -> types.CodeType:
    """The code object continuing ``code`` at ``offset`` with the given stack layout and locals
    as parameters (stack slots first, then the locals by their own names)."""
    key = (code, offset, layout, local_names)
    made = _RESUME_CODES.get(key)
    if made is None:
        made = _build(code, offset, layout, local_names)
        _RESUME_CODES[key] = made
    return made


def _build(code, offset, layout, local_names) -> types.CodeType:
    if code.co_cellvars:
        raise Unsupported("resuming a function that has cell variables (captured by an inner function)")
    original = Bytecode.from_code(code)
    real = [i for i in dis.get_instructions(code) if i.opname not in ("EXTENDED_ARG", "CACHE")]
    instrs = [x for x in original if isinstance(x, Instr)]
    if len(real) != len(instrs) or any(a.opname != b.name for a, b in zip(real, instrs)):
        raise Unsupported("the bytecode package reads this function's code differently from dis")
    try:
        target = instrs[next(i for i, inst in enumerate(real) if inst.offset == offset)]
    except StopIteration:
        raise Unsupported(f"no instruction at offset {offset} to resume from") from None

    # The prefix (MAKE_CELL / COPY_FREE_VARS / RESUME) sets the frame up: it stays first.
    items = list(original)
    prefix_end = next(i for i, x in enumerate(items) if isinstance(x, Instr) and x.name == "RESUME") + 1
    line = code.co_firstlineno
    start = Label()
    prologue = []
    for i, kind in enumerate(layout):
        if kind == NULL_SLOT:
            prologue.append(Instr("PUSH_NULL", lineno=line))
        else:
            prologue.append(Instr("LOAD_FAST", stack_arg_name(i), lineno=line))
            if kind == ITER_SLOT:
                prologue.append(Instr("GET_ITER", lineno=line))
    prologue.append(Instr("JUMP_FORWARD", start, lineno=line))
    body = []
    for x in items[prefix_end:]:
        if x is target:
            body.append(start)
        body.append(x)

    resumed = Bytecode(items[:prefix_end] + prologue + body)
    base_name = code.co_name.removeprefix("resume_in_")
    base_qualname = code.co_qualname.removeprefix("resume_in_").rsplit("_at_", 1)[0] \
        if code.co_qualname.startswith("resume_in_") else code.co_qualname
    resumed.name = f"resume_in_{base_name}"
    resumed.qualname = f"resume_in_{base_qualname}_at_{target.lineno}"
    resumed.filename = code.co_filename
    resumed.first_lineno = code.co_firstlineno
    resumed.freevars = list(code.co_freevars)
    resumed.cellvars = []
    names = [stack_arg_name(i) for i, kind in enumerate(layout) if kind != NULL_SLOT] + list(local_names)
    resumed.argnames = names
    resumed.argcount = len(names)
    resumed.posonlyargcount = 0
    resumed.kwonlyargcount = 0
    resumed.flags = code.co_flags & ~(CO_VARARGS | CO_VARKEYWORDS)
    resumed.docstring = None
    return resumed.to_code()


def resume_function_for(fn: types.FunctionType, offset: int, layout: tuple[str, ...],
                        local_names: tuple[str, ...]) -> types.FunctionType:
    code = resume_code_for(fn.__code__, offset, layout, local_names)
    return types.FunctionType(code, fn.__globals__, code.co_name, None, fn.__closure__)
