"""What changed between the CPython bytecode versions the interpreter follows (3.11, 3.12, 3.13).

Every version difference the handlers and the resume-function builder depend on is named here,
once, as a fact about one opcode family; handlers read these facts instead of comparing version
numbers themselves.
"""

from __future__ import annotations

import sys

PY = sys.version_info[:2]
SUPPORTED = ((3, 11), (3, 12), (3, 13))

# -- calls: where the NULL / self slot sits relative to the callable -------------------------
#: 3.13 lays a call out as ``callable, self_or_null, *args``; 3.11/3.12 as
#: ``null_or_method, callable_or_self, *args``. LOAD_GLOBAL / LOAD_ATTR push the NULL after the
#: callable on 3.13 and before it on earlier versions.
NULL_AFTER_CALLABLE = PY >= (3, 13)

# -- attributes ---------------------------------------------------------------------------
#: 3.12 folded LOAD_METHOD into LOAD_ATTR (low oparg bit set: push a method pair).
LOAD_ATTR_HAS_METHOD_BIT = PY >= (3, 12)

# -- loops --------------------------------------------------------------------------------
#: What FOR_ITER does when the iterator is exhausted: 3.11 pops it and jumps past the loop;
#: 3.12 pops it and skips the END_FOR it jumps to; 3.13 leaves it (plus a placeholder) for the
#: END_FOR / POP_ITER at the jump target to pop.
FOR_ITER_EXHAUSTED = "pop" if PY == (3, 11) else "pop_skip_end_for" if PY == (3, 12) else "leave_for_end_for"
#: 3.12's END_FOR pops two values (the iterator and the last item); 3.13's pops one.
END_FOR_POPS = 2 if PY == (3, 12) else 1

# -- cells --------------------------------------------------------------------------------
#: 3.13 dropped the LOAD_CLOSURE instruction: building a closure tuple loads the cell itself
#: with LOAD_FAST from the cell's slot.
LOAD_FAST_LOADS_CELLS = PY >= (3, 13)
#: The instruction a resume function uses to push a cell object for a closure tuple.
LOAD_CELL_OPNAME = "LOAD_FAST" if LOAD_FAST_LOADS_CELLS else "LOAD_CLOSURE"

#: 3.13's POP_JUMP_IF_TRUE/FALSE test for the exact ``True``/``False`` objects (the compiler puts
#: a TO_BOOL before them), so a jump rebuilt outside the original code needs its own TO_BOOL.
BRANCH_NEEDS_TO_BOOL = PY >= (3, 13)
#: 3.11 announces every CALL with a PRECALL.
HAS_PRECALL = PY == (3, 11)

# -- conditional jumps --------------------------------------------------------------------
#: 3.11 has direction-specific conditional jumps (POP_JUMP_FORWARD_IF_*); 3.12+ has only
#: POP_JUMP_IF_* and the assembler picks the direction.
DIRECTIONAL_JUMPS = PY == (3, 11)

__all__ = ["BRANCH_NEEDS_TO_BOOL", "DIRECTIONAL_JUMPS", "END_FOR_POPS", "FOR_ITER_EXHAUSTED", "HAS_PRECALL", "LOAD_ATTR_HAS_METHOD_BIT",
           "LOAD_CELL_OPNAME", "LOAD_FAST_LOADS_CELLS", "NULL_AFTER_CALLABLE", "PY", "SUPPORTED"]
