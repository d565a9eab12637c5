"""Resume functions: new code objects that continue a function from the middle.

After a graph break the graph captured so far has run and the unsupported instruction has run in
plain Python; what is left of the function runs as a *resume function*. It is the original code
with a short prologue: its parameters are the value-stack entries and the live locals at the
break, it pushes the stack entries back (``PUSH_NULL`` where the interpreter had a NULL,
``GET_ITER`` over the remaining items of a ``for`` loop's iterator) and jumps to the resume
offset. The rest of the original bytecode is kept whole, so that loops can jump back, every
later instruction keeps its line number, and the exception table still covers the try and with
regions the jump lands in (their handler depths are copied from the original table). The
frame's cells come in as parameters holding the cells themselves (no MAKE_CELL), so closures
made before the break and after it share them. Built with the ``bytecode`` package.

A *trampoline* (``trampoline_code_for``) is the same construction entered at the break
instruction itself; right after it, a jump leaves every region for an epilogue that calls
``___then(resume offset, *stack, *locals, *cells)``.
"""

from __future__ import annotations

import dis
import types

from bytecode import Bytecode, CellVar, Instr, Label, TryBegin

from fireclay_capture import bytecode_versions as versions
from fireclay_capture.code_flags import CO_VARARGS, CO_VARKEYWORDS
from fireclay_capture.errors import Unsupported

#: What each stack slot holds when the resume function starts.
NULL_SLOT, VALUE_SLOT, ITER_SLOT = "null", "value", "iter"

_RESUME_CODES: dict[tuple, types.CodeType] = {}


def enclosing_handlers(code: types.CodeType, offset: int) -> list[str]:
    """The try/with regions around ``offset``: "with" for a with-block, "try" for the rest."""
    insts = list(dis.get_instructions(code))
    by_offset = {inst.offset: i for i, inst in enumerate(insts)}
    kinds = []
    for e in dis.Bytecode(code).exception_entries:  # type: ignore[attr-defined]  # 3.11+, missing from the stubs
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


def _build(code, offset, layout, local_names, trampoline: tuple | None = None) -> types.CodeType:
    original = Bytecode.from_code(code)
    real = [i for i in dis.get_instructions(code) if i.opname not in ("EXTENDED_ARG", "CACHE")]
    instrs = [x for x in original if isinstance(x, Instr)]
    if len(real) != len(instrs) or any(a.opname != b.name for a, b in zip(real, instrs)):
        raise Unsupported("the bytecode package reads this function's code differently from dis")
    try:
        at = next(i for i, inst in enumerate(real) if inst.offset == offset)
    except StopIteration:
        raise Unsupported(f"no instruction at offset {offset} to resume from") from None
    target = instrs[at]
    broken = None
    if trampoline is not None:
        # Enter just before the break instruction: a call's KW_NAMES (and 3.11's PRECALL) set
        # state that its CALL reads, so they run again (neither touches the value stack).
        broken = target
        while at > 0 and instrs[at - 1].name in ("PRECALL", "KW_NAMES"):
            at -= 1
        target = instrs[at]

    # The prologue jumps past the TryBegin of the region it enters, so a flow analysis would not
    # find each handler's stack depth: take it from the original exception table.
    begins = [x for x in original if isinstance(x, TryBegin)]
    entries = sorted(dis.Bytecode(code).exception_entries, key=lambda e: e.start)  # type: ignore[attr-defined]  # 3.11+, missing from the stubs
    if len(begins) != len(entries):
        raise Unsupported("the bytecode package reads this function's exception table differently from dis")
    for begin, entry in zip(begins, entries):
        begin.stack_depth = entry.depth
        begin.push_lasti = entry.lasti
    # The prefix (MAKE_CELL / COPY_FREE_VARS / RESUME) sets the frame up: it stays first, less
    # MAKE_CELL: the cells arrive as parameters, the very cell objects the frame had, so that
    # inner functions made before the break and after it share them.
    # (3.12 also makes cells inside inlined comprehensions, after RESUME: those stay.)
    items = list(original)
    resume_at = next(i for i, x in enumerate(items) if isinstance(x, Instr) and x.name == "RESUME")
    items = [x for i, x in enumerate(items) if i > resume_at or not (isinstance(x, Instr) and x.name == "MAKE_CELL")]
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
    epilogue: list = []
    for x in items[prefix_end:]:
        if x is target:
            body.append(start)
        if x is broken and trampoline is not None:
            body.extend(_break_and_leave(x, trampoline, epilogue, line))
        else:
            body.append(x)

    resumed = Bytecode(items[:prefix_end] + prologue + body + epilogue)
    base_name = code.co_name.removeprefix("resume_in_")
    base_qualname = code.co_qualname.removeprefix("resume_in_").rsplit("_at_", 1)[0] \
        if code.co_qualname.startswith("resume_in_") else code.co_qualname
    resumed.name = f"resume_in_{base_name}"
    resumed.qualname = f"resume_in_{base_qualname}_at_{target.lineno}"
    resumed.filename = code.co_filename
    resumed.first_lineno = code.co_firstlineno
    resumed.freevars = list(code.co_freevars)
    resumed.cellvars = list(code.co_cellvars)
    names = [stack_arg_name(i) for i, kind in enumerate(layout) if kind != NULL_SLOT] + list(local_names) \
        + list(code.co_cellvars)
    if trampoline is not None:
        names.append(THEN_ARG)
    resumed.argnames = names
    resumed.argcount = len(names)
    resumed.posonlyargcount = 0
    resumed.kwonlyargcount = 0
    resumed.flags = code.co_flags & ~(CO_VARARGS | CO_VARKEYWORDS)
    resumed.docstring = None
    # Handler depths are the original ones (above); the stack holds at most the original code's
    # plus what the prologue and the epilogue hold.
    depth = code.co_stacksize + len(layout) + len(local_names) + len(code.co_cellvars) + 4
    made = resumed.to_code(stacksize=depth, compute_exception_stack_depths=False)
    if made.co_cellvars:
        _CELL_PARAMETERS[made] = tuple(made.co_cellvars)
    return made


#: Resume and trampoline code objects whose cell variables are parameters holding the cells.
_CELL_PARAMETERS: dict[types.CodeType, tuple[str, ...]] = {}


def cell_parameters(code: types.CodeType) -> tuple[str, ...]:
    """The parameters of a resume function that are cells (not values to put in new cells)."""
    return _CELL_PARAMETERS.get(code, ())


THEN_ARG = "___then"
_FORWARD_BRANCH = {  # every conditional jump, as the forward jump of this Python's bytecode
    name: ("POP_JUMP_FORWARD_IF_" if versions.DIRECTIONAL_JUMPS else "POP_JUMP_IF_") + name.rsplit("_IF_", 1)[1]
    for name in ("POP_JUMP_IF_TRUE", "POP_JUMP_IF_FALSE", "POP_JUMP_FORWARD_IF_TRUE", "POP_JUMP_FORWARD_IF_FALSE",
                 "POP_JUMP_BACKWARD_IF_TRUE", "POP_JUMP_BACKWARD_IF_FALSE")}


def _break_and_leave(inst, trampoline: tuple, epilogue: list, line: int) -> list:
    """The break instruction as the trampoline runs it, then a jump out of every try/with region
    to an epilogue that hands the frame's state to ``___then(resume offset, *stack, *locals)``."""
    out_layout, local_names, next_offset, jump_offset, cell_names = trampoline
    leave_next = Label()
    _epilogue(epilogue, leave_next, next_offset, out_layout, local_names, cell_names, line)
    if inst.name in _FORWARD_BRANCH:
        leave_jump = Label()
        _epilogue(epilogue, leave_jump, jump_offset, out_layout, local_names, cell_names, line)
        branch = [Instr(_FORWARD_BRANCH[inst.name], leave_jump, location=inst.location)]
        if versions.BRANCH_NEEDS_TO_BOOL:
            branch.insert(0, Instr("TO_BOOL", location=inst.location))
    else:
        branch = [inst]
    return [*branch, Instr("JUMP_FORWARD", leave_next, lineno=line)]


def _epilogue(out: list, label: Label, offset: int, layout: tuple[str, ...], local_names, cell_names,
              line: int) -> None:
    out.append(label)
    # Pop the whole stack into temporaries (STORE_FAST takes the interpreter's NULLs too).
    for i in reversed(range(len(layout))):
        out.append(Instr("STORE_FAST", f"___out{i}", lineno=line))
    if not versions.NULL_AFTER_CALLABLE:
        out.append(Instr("PUSH_NULL", lineno=line))
    out.append(Instr("LOAD_FAST", THEN_ARG, lineno=line))
    if versions.NULL_AFTER_CALLABLE:
        out.append(Instr("PUSH_NULL", lineno=line))
    out.append(Instr("LOAD_CONST", offset, lineno=line))
    n = 1
    for i, kind in enumerate(layout):
        if kind != NULL_SLOT:
            out.append(Instr("LOAD_FAST", f"___out{i}", lineno=line))
            n += 1
    for name in local_names:
        out.append(Instr("LOAD_FAST", name, lineno=line))
        n += 1
    for name in cell_names:
        out.append(Instr(versions.LOAD_CELL_OPNAME, CellVar(name), lineno=line))
        n += 1
    if versions.HAS_PRECALL:
        out.append(Instr("PRECALL", n, lineno=line))
    out.append(Instr("CALL", n, lineno=line))
    out.append(Instr("RETURN_VALUE", lineno=line))


def trampoline_code_for(code: types.CodeType, offset: int, layout: tuple[str, ...], local_names: tuple[str, ...],
                        out_layout: tuple[str, ...], next_offset: int, jump_offset: int | None) -> types.CodeType:
    """The code object that runs the break instruction at ``offset`` *inside* the function's own
    try/with regions (so that its exception reaches the user's except, finally or ``__exit__``),
    then leaves every region and returns ``___then(resume offset, *stack, *locals)``; its
    parameters are the stack before the instruction, the locals, and ``___then``."""
    key = ("trampoline", code, offset, layout, local_names, out_layout, next_offset, jump_offset)
    made = _RESUME_CODES.get(key)
    if made is None:
        made = _build(code, offset, layout, local_names,
                      (out_layout, local_names, next_offset, jump_offset, tuple(code.co_cellvars)))
        _RESUME_CODES[key] = made
    return made


def resume_function_for(fn: types.FunctionType, offset: int, layout: tuple[str, ...],
                        local_names: tuple[str, ...]) -> types.FunctionType:
    code = resume_code_for(fn.__code__, offset, layout, local_names)
    return types.FunctionType(code, fn.__globals__, code.co_name, None, fn.__closure__)
