"""Merge a kernel's adjacent loops that every index walks as one flat loop.

A kernel keeps the loops of the tensors it was built from: GELU over a contiguous
``[8, 512, 3072]`` tensor runs ``x0 < 8, x1 < 512, x2 < 3072`` and addresses
``1572864*x0 + 3072*x1 + x2``, which is the flat index itself. Code generators then split the
flat index into digits with ``//`` and ``%`` on every element, and neither a GPU compiler nor a
C++ vectoriser can see that the addresses are contiguous. Two adjacent loops ``a`` (outer) and
``b`` (inner, extent ``S_b``) can be one loop of extent ``S_a*S_b`` when every expression over
them — memory indices, ``index_expr`` values, random offsets — depends on them only through
``S_b*a + b``: affine in both with ``coefficient(a) == coefficient(b) * S_b`` (both zero allowed).
The merged loop visits the same points in the same order, so nothing else changes. A loop of
static extent 1 merges with its neighbour whatever the expressions say (it is always 0).

What never merges: a loop with another kind of loop (outer with reduction), a broadcast
(``bias[x1]`` over rows: coefficient 0 for the rows, 1 for the columns), a transposed or
permuted read, a mask built from loop indices (``x1 >= x2``), a view whose digits the kernel's
loops split (``FloorDiv``/``Mod`` of a loop variable), and sizes for which the rule does not hold
symbolically. :func:`merge_kernel_loops` is the pass, run last when kernels are finished; it
gives back the same kernel when nothing merges.

Each node is rewritten one of three ways. When its own two loop variables map straight to the
two kernel loops (the usual case), its body gets one variable in their place and every index
expression is rewritten (``3072*i1 + 1572864*i0`` becomes ``3072*i0``), so no ``//`` is left. When
its variables map to expressions over the kernel loops that walk the pair as one (a node fused
through a view: ``i0 -> 3*x0 + x1``), those expressions are rewritten and the body is kept.
Otherwise (``i0 -> FloorDiv(x0, 3)``, ``i1 -> Mod(x0, 3)``) its body is first re-expressed over
the kernel's loops, the digits joined back where they add up to a loop, and merged as in the
first case; if any expression still splits a loop, the pair stays two loops.
"""

from __future__ import annotations

from typing import Any

import sympy

from fireclay_loops import exprs
from fireclay_loops.body import LoopBody
from fireclay_loops.ir import ComputeNode
from fireclay_loops.kernel import Kernel, KernelNode


def merge_kernel_loops(kernel: Kernel) -> Kernel:
    """``kernel`` with every pair of adjacent outer loops, and of adjacent reduction loops,
    merged where all its nodes allow it (innermost pairs first)."""
    merged = kernel
    for which in ("x", "r"):
        j = len(_sizes(merged, which)) - 2
        while j >= 0:
            candidate = _merge_pair(merged, which, j)
            if candidate is not None:
                merged = candidate
            j -= 1
    return merged


# --------------------------------------------------------------------------- one pair


def _sizes(k: Kernel, which: str) -> list[sympy.Expr]:
    return k.xsizes if which == "x" else k.rsizes


def _unit(size: sympy.Expr) -> bool:
    return exprs.to_static(size) == 1


def _merge_pair(k: Kernel, which: str, j: int) -> Kernel | None:
    """``k`` with loops ``j`` and ``j + 1`` of kind ``which`` merged, or None if some node
    addresses them in a way one loop cannot."""
    sizes = _sizes(k, which)
    kvars = k.xvars if which == "x" else k.rvars
    a, b = kvars[j], kvars[j + 1]
    size_a, size_b = sizes[j], sizes[j + 1]
    # The merged loop keeps the name of ``a``; the loops after ``b`` move down by one.
    shift = {kvars[m]: exprs.symbol(f"{which}{m - 1}") for m in range(j + 2, len(kvars))}
    pair = _Pair(a, b, size_a, size_b)
    loop_symbols = set(k.xvars) | set(k.rvars)
    for kn in k.nodes:
        loop_symbols |= {exprs.symbol(n) for n in kn.node.body.indirect_symbols()}
    nodes = []
    for kn in k.nodes:
        new = _merge_node(kn, pair, shift, loop_symbols, k)
        if new is None:
            return None
        nodes.append(new)
    new_sizes = sizes[:j] + [sympy.expand(size_a * size_b)] + sizes[j + 2:]
    xsizes, rsizes = (new_sizes, list(k.rsizes)) if which == "x" else (list(k.xsizes), new_sizes)
    return Kernel(k.name, nodes, xsizes, rsizes, set(k.internal))


class _Pair:
    """Two adjacent loops ``a`` (outer) and ``b`` (inner) and how an expression over them is
    rewritten over the merged loop, which takes ``a``'s name."""

    def __init__(self, a: sympy.Symbol, b: sympy.Symbol, size_a: sympy.Expr, size_b: sympy.Expr):
        self.a, self.b, self.size_a, self.size_b = a, b, size_a, size_b

    def compatible(self, e: sympy.Expr, u: sympy.Symbol, v: sympy.Symbol, loop_symbols: set[Any]) -> bool:
        """Whether ``e`` depends on ``u`` (in the outer role) and ``v`` (inner) only through
        ``size_b*u + v``; a unit loop needs nothing."""
        if _unit(self.size_a) or _unit(self.size_b):
            return True
        return walks_as_one(e, u, v, self.size_b, loop_symbols)

    def substitution(self, u: sympy.Symbol, v: sympy.Symbol, merged: sympy.Symbol) -> dict[Any, Any]:
        """``u`` and ``v`` in terms of the merged variable, for an expression ``compatible``
        allows: ``c*(S*u + v)`` is ``c*w``, so ``u -> 0, v -> w``; a unit loop is always 0."""
        if _unit(self.size_b) and not _unit(self.size_a):
            return {v: sympy.Integer(0), u: merged}
        return {u: sympy.Integer(0), v: merged}


def walks_as_one(e: sympy.Expr, u: sympy.Symbol, v: sympy.Symbol, size_v: sympy.Expr,
                 loop_symbols: set[Any]) -> bool:
    """Whether ``e`` is affine in ``u`` and ``v`` with ``coefficient(u) == coefficient(v) *
    size_v``, coefficients free of loop variables (proved by sympy, for symbolic sizes too)."""
    e = sympy.expand(exprs.as_expr(e))
    if not e.free_symbols & {u, v}:
        return True
    coeff = {u: sympy.Integer(0), v: sympy.Integer(0)}
    for term in sympy.Add.make_args(e):
        if not term.free_symbols & {u, v}:
            continue
        c, rest = term.as_coeff_Mul()  # the usual ``stride*loop``, without sympy's general split
        if rest not in coeff:
            c, rest = term.as_independent(u, v, as_Add=False)
        if rest not in coeff or c.free_symbols & loop_symbols:
            return False  # a product of loop variables, or one inside FloorDiv/Mod/a power
        coeff[rest] = coeff[rest] + c
    return bool(sympy.expand(coeff[u] - coeff[v] * exprs.as_expr(size_v)) == 0)


def _merge_node(kn: KernelNode, pair: _Pair, shift: dict[Any, Any], loop_symbols: set[Any], k: Kernel) -> KernelNode | None:
    body = kn.node.body
    own = body.vars + body.reduction_vars
    if any(u not in kn.var_map for u in own):
        return None
    touching = [u for u in own if kn.var_map[u].free_symbols & {pair.a, pair.b}]
    if not touching:  # an epilogue over the outer loops while reduction loops merge
        return KernelNode(kn.node, {u: kn.var_map[u].xreplace(shift) for u in own}, kn.stage)
    plain = _plain_pair(kn, pair)
    if plain is not None and set(touching) == set(plain[:2]):
        return _merge_body_vars(kn, pair, shift, loop_symbols, *plain)
    # The node's loops are a view of the kernel's (fused through a reshape). When the
    # expressions they map to walk the pair as one, rewriting those is enough...
    if not any(u in body.reduction_vars for u in touching) and \
            all(pair.compatible(kn.var_map[u], pair.a, pair.b, loop_symbols) for u in touching):
        sub = pair.substitution(pair.a, pair.b, pair.a)
        return KernelNode(kn.node, {u: sympy.expand(kn.var_map[u].xreplace(sub)).xreplace(shift) for u in own},
                          kn.stage)
    # ...else the body is rewritten over the kernel's own loops first (digits a view split
    # apart are joined back), and merged like any other.
    rebased = _rebased(kn, k)
    plain = None if rebased is None else _plain_pair(rebased, pair)
    if rebased is None or plain is None:
        return None
    return _merge_body_vars(rebased, pair, shift, loop_symbols, *plain)


def _rebased(kn: KernelNode, k: Kernel) -> KernelNode | None:
    """The node with a body over the kernel's loops themselves: one body variable per kernel
    loop, every index composed with ``var_map`` and its ``FloorDiv``/``Mod`` digit pairs joined
    (``24*FloorDiv(x0, 3) + 8*Mod(x0, 3)`` is ``8*x0``). None when its reduction loops are not the
    kernel's, in order (the order decides what an argmax returns)."""
    body = kn.node.body
    if body.reduction_vars and [kn.var_map[r] for r in body.reduction_vars] != k.rvars:
        return None
    targets = [kn.var_map[u] for u in body.vars]
    uses_r = any(t.free_symbols & set(k.rvars) for t in targets)
    if uses_r and body.reduction_vars:
        return None
    pointwise_loops = k.xvars + (k.rvars if uses_r and not body.reduction_vars else [])
    sizes = k.xsizes + (k.rsizes if uses_r and not body.reduction_vars else [])
    new_body = LoopBody(sizes, k.rsizes if body.reduction_vars else [])
    rename = dict(zip(pointwise_loops, new_body.vars)) | dict(zip(k.rvars if body.reduction_vars else [],
                                                                    new_body.reduction_vars))
    compose = {u: kn.var_map[u].xreplace(rename) for u in body.vars + body.reduction_vars}
    for op in body.ops:
        args = tuple(_join_digits(sympy.expand(a.xreplace(compose))) if isinstance(a, sympy.Basic) and a.free_symbols
                     else a for a in op.args)
        new_body.ops.append(type(op)(op.name, args, op.dtype))
    var_map = {v: kv for kv, v in rename.items()}
    return KernelNode(ComputeNode(kn.node.name, new_body, kn.node.meta), var_map, kn.stage)


def _join_digits(e: sympy.Expr) -> sympy.Expr:
    """``c*d*FloorDiv(a, d) + c*Mod(a, d)`` as ``c*a``, the rule :func:`exprs.equal` proves with."""
    return exprs._recombine(e) if e.has(exprs.FloorDiv, exprs.Mod) else e


def _plain_pair(kn: KernelNode, pair: _Pair) -> tuple[str, str, str, int] | None:
    """``(u, v, which, position)`` when the node's body variables ``u`` and ``v``, adjacent in
    that order in one of its variable lists, map exactly to the kernel loops ``a`` and ``b``."""
    body = kn.node.body
    for which, names, sizes in (("i", body.vars, body.sizes), ("r", body.reduction_vars, body.reduction_sizes)):
        for p in range(len(names) - 1):
            u, v = names[p], names[p + 1]
            if kn.var_map[u] == pair.a and kn.var_map[v] == pair.b:
                if exprs.equal(sizes[p], pair.size_a) and exprs.equal(sizes[p + 1], pair.size_b):
                    return u, v, which, p
    return None


def _merge_body_vars(kn: KernelNode, pair: _Pair, shift: dict[Any, Any], loop_symbols: set[Any],
                     u: sympy.Symbol, v: sympy.Symbol, which: str, p: int) -> KernelNode | None:
    """The node with its body variables ``u`` and ``v`` merged into one, every index rewritten."""
    body = kn.node.body
    own_loops = set(body.vars) | set(body.reduction_vars) | {exprs.symbol(n) for n in body.indirect_symbols()}
    own_loops |= loop_symbols
    indices = {a for op in body.ops for a in op.args if isinstance(a, sympy.Basic) and a.free_symbols & {u, v}}
    if not all(pair.compatible(e, u, v, own_loops) for e in indices):
        return None
    names = body.vars if which == "i" else body.reduction_vars
    sizes = body.sizes if which == "i" else body.reduction_sizes
    new_sizes = sizes[:p] + [sympy.expand(sympy.Mul(sizes[p], sizes[p + 1]))] + sizes[p + 2:]
    new_body = LoopBody(new_sizes if which == "i" else body.sizes,
                        new_sizes if which == "r" else body.reduction_sizes)
    new_names = new_body.vars if which == "i" else new_body.reduction_vars
    sub = pair.substitution(u, v, new_names[p])
    sub |= {names[m]: new_names[m - 1] for m in range(p + 2, len(names))}
    for op in body.ops:
        args = tuple(sympy.expand(a.xreplace(sub)) if isinstance(a, sympy.Basic) and a.free_symbols else a
                     for a in op.args)
        new_body.ops.append(type(op)(op.name, args, op.dtype))
    var_map = {}
    for old in body.vars + body.reduction_vars:
        if old == v:
            continue
        new = sub.get(old, old) if old != u else new_names[p]
        var_map[new] = pair.a if old == u else kn.var_map[old].xreplace(shift)
    node = ComputeNode(kn.node.name, new_body, kn.node.meta)
    return KernelNode(node, var_map, kn.stage)
