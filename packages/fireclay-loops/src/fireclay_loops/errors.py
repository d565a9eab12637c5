"""The errors fireclay-loops raises, naming the aten node and the user's code it came from."""

from __future__ import annotations

from typing import Any


class LoweringError(Exception):
    """An aten program fireclay-loops cannot lower; the message names the node and its source."""

    def __init__(self, message: str, node: Any = None):
        where = ""
        if node is not None:
            outs = ", ".join(f"%{o.name}" for o in node.outputs)
            where = f"\n  while lowering: {outs} = {node.op}"
            src = node.source
            if src:
                where += f"\n  from your code: {src.get('file')}:{src.get('line')}: {src.get('text', '').strip()}"
        super().__init__(message + where)


class SchedulingError(Exception):
    """An inconsistency found while scheduling (a bug in a lowering or in the scheduler)."""


class IndexOutOfBounds(IndexError, RuntimeError):
    """A compiled kernel read an index from a tensor that lies outside the dimension it indexes.
    Eager raises ``IndexError`` for most such ops and ``RuntimeError`` for some (``gather``,
    ``index_select`` over an inner dimension): this is both, so code catching either still does."""


class IntegerDivisionByZero(RuntimeError, ZeroDivisionError):
    """A compiled kernel divided integers by zero (``//``, ``%``, ``fmod``, ``div`` with a
    rounding mode): eager raises ``RuntimeError("ZeroDivisionError")`` on the CPU."""


def check_failure(op: str, site: str, value: Any = None, size: Any = None) -> Exception:
    """The error a failed ``ops.check_bounds`` / ``ops.check_nonzero`` (``op``) at ``site``
    raises; ``value`` and ``size``: the index and the dimension's size, where known."""
    if op == "check_nonzero":
        return IntegerDivisionByZero(f"ZeroDivisionError: integer division by zero in {site}")
    if value is None:
        return IndexOutOfBounds(f"index out of bounds for {site} (size {size})")
    return IndexOutOfBounds(f"index {value} is out of bounds for {site} with size {size}")
