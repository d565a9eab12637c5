"""Scheduled kernels: what code generators consume.

A :class:`Kernel` runs over an iteration space of outer variables ``x0, x1, ...`` (sizes
``xsizes``, their product is the pointwise numel) and reduction variables ``r0, ...`` (sizes
``rsizes``, the reduction numel; empty for a pointwise kernel). It holds loop nodes in order;
each :class:`KernelNode` maps its body's own variables to expressions over kernel variables
(``var_map``: usually a kernel variable, a ``FloorDiv``/``Mod`` digit of one when the node's
loops are a view of the kernel's), so ``node.body.run(handler, kn.var_map)`` replays it in
kernel space. ``stage`` numbers the
reduction loops a looped-reduction code generator needs: a node reading a reduction result of
its own kernel runs in a later loop over ``r`` than that reduction. Buffers in ``internal`` are
written and read only inside the kernel, at the same index: they never reach memory.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import sympy

from fireclay_loops import exprs
from fireclay_loops.ir import ComputeNode
from fireclay_loops.ops import MEMORY_OPS  # (ops whose first argument is a buffer name)


@dataclass
class KernelNode:
    node: ComputeNode
    var_map: dict[sympy.Symbol, sympy.Expr]
    stage: int = 0

    def reads(self) -> list[tuple[str, sympy.Expr, str]]:
        return [(b, i.xreplace(self.var_map), k) for b, i, k in self.node.body.reads()]

    def writes(self) -> list[tuple[str, sympy.Expr, str]]:
        return [(b, i.xreplace(self.var_map), k) for b, i, k in self.node.body.writes()]


@dataclass
class Kernel:
    name: str
    nodes: list[KernelNode]
    xsizes: list[sympy.Expr]
    rsizes: list[sympy.Expr]
    internal: set[str] = field(default_factory=set)

    @property
    def kind(self) -> str:
        return "reduction" if any(kn.node.kind == "reduction" for kn in self.nodes) else "pointwise"

    @property
    def xvars(self) -> list[sympy.Symbol]:
        return [exprs.symbol(f"x{k}") for k in range(len(self.xsizes))]

    @property
    def rvars(self) -> list[sympy.Symbol]:
        return [exprs.symbol(f"r{k}") for k in range(len(self.rsizes))]

    @property
    def numel(self) -> sympy.Expr:
        return exprs.product(self.xsizes)

    @property
    def rnumel(self) -> sympy.Expr:
        return exprs.product(self.rsizes)

    # Buffer names only: the nodes' own accesses, without rewriting their indices into kernel space.
    def read_buffers(self) -> list[str]:
        return list(dict.fromkeys(b for kn in self.nodes for b, _, _ in kn.node.body.reads() if b not in self.internal))

    def write_buffers(self) -> list[str]:
        return list(dict.fromkeys(b for kn in self.nodes for b, _, _ in kn.node.body.writes()
                                  if b not in self.internal))

    def accumulated_buffers(self) -> list[str]:
        """The buffers the kernel adds into (``ops.store_add``): each must hold zeros before the
        kernel runs, and the code generator clears it."""
        return list(dict.fromkeys(b for kn in self.nodes for b, _, k in kn.node.body.writes() if k == "store_add"))




def _argument_key(a: Any) -> Any:
    """A hashable stand-in for one op argument that tells apart what a code generator writes
    differently: ``1``, ``1.0``, ``True`` and ``-0.0`` (equal as Python values) keep their types and
    bits. Raises TypeError for an argument of no known kind."""
    if isinstance(a, (bool, int, str)) or a is None:
        return (type(a).__name__, a)
    if isinstance(a, float):
        return ("float", a.hex())  # -0.0 and 0.0 differ; every nan of one payload is one key
    if isinstance(a, sympy.Basic):
        return (type(a).__name__, a)
    if isinstance(a, (tuple, list)):
        return (type(a).__name__,) + tuple(_argument_key(x) for x in a)
    if type(a).__hash__ is not None and _frozen_dataclass(a):
        return (type(a).__name__, a)
    raise TypeError(f"no structural key for an argument of type {type(a).__name__}")


def _frozen_dataclass(a: Any) -> bool:
    params = getattr(type(a), "__dataclass_params__", None)
    return bool(params is not None and params.frozen)


def structure(kernel: Kernel, describe: Callable[[str], Any]) -> tuple[Any, list[str]] | None:
    """A key that two kernels share exactly when they do the same work on other buffers, and the
    kernel's buffers in the order the key numbers them. The key holds every node's ops (buffer names
    replaced by their number in order of first use), variable maps and stages, the kernel's sizes
    and internal buffers, and ``describe(buffer)`` of each buffer (what a code generator reads of
    it: its dtype, its extent). None when some op argument has no structural key (never shared).

    A code generator that writes a kernel's text from these alone, with its arguments in order of
    first use, may reuse one kernel's text for any kernel of the same key (the layers of a model)."""
    numbers: dict[str, int] = {}

    def number(buf: str) -> int:
        found = numbers.get(buf)
        if found is None:
            found = numbers[buf] = len(numbers)
        return found

    try:
        nodes = []
        for kn in kernel.nodes:
            body = kn.node.body
            ops = []
            for op in body.ops:
                if op.name in MEMORY_OPS:
                    args = (("buffer", number(op.args[0])),) + tuple(_argument_key(a) for a in op.args[1:])
                else:
                    args = tuple(_argument_key(a) for a in op.args)
                ops.append((op.name, args, op.dtype))
            nodes.append((tuple(body.sizes), tuple(body.reduction_sizes), tuple(ops),
                          tuple(kn.var_map.items()), kn.stage))
        buffers = list(numbers)
        internal = tuple(sorted(numbers[b] for b in kernel.internal if b in numbers))
        key = (tuple(nodes), tuple(kernel.xsizes), tuple(kernel.rsizes), internal,
               tuple(describe(b) for b in buffers))
        hash(key)
    except TypeError:
        return None
    return key, buffers
