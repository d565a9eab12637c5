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
