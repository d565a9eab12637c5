"""The lowering table: one registration per aten op (``"add.Tensor"`` for ``aten::add.Tensor``).

A lowering is ``fn(ctx, *args, **kwargs)`` with tensor arguments as TensorValues; it returns a
TensorValue (or a tuple, one per output of the aten node). Ops absent from the table become
fallback nodes.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

# A lowering: ``rule(ctx, *args, **kwargs)`` -> a TensorValue or a tuple of them.
Lowering = Callable[..., Any]
LOWERINGS: dict[str, Lowering] = {}


def register_lowering(*targets: str) -> Callable[[Lowering], Lowering]:
    def deco(fn: Lowering) -> Lowering:
        for t in targets:
            if t in LOWERINGS:
                raise ValueError(f"aten::{t} already has a lowering ({LOWERINGS[t].__name__})")
            LOWERINGS[t] = fn
        return fn

    return deco
