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

from dataclasses import dataclass, field

import sympy

from fireclay_loops import exprs
from fireclay_loops.ir import ComputeNode


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
