"""Inlining: recompute a cheap pointwise producer inside a consumer that cannot share a kernel
with it (it reads the producer's buffer at another index: a broadcast, a flip, a shifted
slice...), so the buffer need not be stored for that consumer.

Producers are visited after their consumers, so a chain ending in such a consumer is recomputed
there whole (batch norm -> relu -> max pool: the pooling windows recompute both, and the
normalised tensor is never stored), until the consumer's body reaches
``INLINED_BODY_LIMIT * config.max_inline_ops`` ops; beyond that, producers are stored.

The consumer's body is re-recorded define-by-run: replaying it on a handler that forwards every
op to a new recorder, except loads of the producer's buffer, which replay the producer's body at
the loaded position instead. The producer's loop variables are recovered from the flat index
the consumer loads (``i_k = (index // stride_k) % size_k``, simplified with the consumer's loop
ranges, so broadcasts and slices fold back to plain variables).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import sympy

from fireclay_loops import exprs
from fireclay_loops.body import BodyRecorder, LoopBody
from fireclay_loops.config import config
from fireclay_loops.ir import ComputeNode, LoopProgram

_PRODUCER_VARS_LIMIT = 1 << 14
_producer_vars_by_store: dict[Any, tuple[tuple[sympy.Symbol, sympy.Expr, sympy.Expr], ...] | None] = {}
# (by store index, variables and sizes)


def _producer_vars(p: ComputeNode) -> list[tuple[sympy.Symbol, sympy.Expr, sympy.Expr]] | None:
    """``(var, stride, size)`` of a pointwise producer that stores at ``sum(var * stride)``
    (contiguously), or None when its store has another shape."""
    [(_, index, _)] = p.body.writes()
    key = (index, tuple(p.body.vars), tuple(p.body.sizes))
    if key not in _producer_vars_by_store:  # asked for every node and every inlined load
        if len(_producer_vars_by_store) >= _PRODUCER_VARS_LIMIT:
            _producer_vars_by_store.clear()
        made = _store_vars(index, p.body.vars, p.body.sizes)
        _producer_vars_by_store[key] = tuple(made) if made is not None else None
    kept = _producer_vars_by_store[key]
    return list(kept) if kept is not None else None


def _store_vars(index: sympy.Expr, vars_: list[sympy.Symbol],
                sizes: list[sympy.Expr]) -> list[tuple[sympy.Symbol, sympy.Expr, sympy.Expr]] | None:
    index = sympy.expand(index)
    out, rest = [], index
    for v, n in zip(vars_, sizes):
        c = index.coeff(v)
        if c.free_symbols & set(vars_) or (exprs.to_static(c) or 0) <= 0:
            return None
        out.append((v, c, n))
        rest = rest - c * v
    return out if sympy.expand(rest) == 0 else None


def _recovered(index: Any, stride: sympy.Expr, size: sympy.Expr,
               producer_vars: Sequence[tuple[sympy.Symbol, sympy.Expr, sympy.Expr]]) -> sympy.Expr:
    """The producer variable of ``stride`` recovered from the flat ``index`` of a load.

    In a contiguous store (each stride a multiple of every smaller one) that is ``(index //
    stride) % (nearest // stride)``, with ``nearest`` the next larger stride (``stride * size``,
    or more for rows padded past their size: ``32*x0 + x1`` over ``x1 < 7`` gives ``x1 = index %
    32``). Rows padded by :func:`fireclay_loops.layout.padded_strides` can break that chain: in
    ``192*x0 + 64*x1 + 7*x2 + x3`` (planes of 7 x 7 padded to 64) 64 is no multiple of 7, and
    ``index % 7`` is not ``x3``. Each part below a stride is smaller than that stride, though, so
    taking the index modulo every larger stride, outermost first, leaves this variable's part
    and the smaller ones: ``x3 = ((index % 192) % 64) % 7``, ``x2 = ((index % 192) % 64) // 7``."""
    st = exprs.to_static(stride)
    outer = sorted({o for _, s, _ in producer_vars if (o := exprs.to_static(s)) is not None and st is not None
                    and o > st}, reverse=True)
    if st is None or not outer:
        return exprs.modular_indexing(index, stride, size)
    nearest = outer[-1]
    if nearest % st == 0 and all(o % nearest == 0 for o in outer):
        return exprs.modular_indexing(index, stride, sympy.Integer(nearest // st))
    rest = exprs.as_expr(index)
    for o in outer:
        rest = exprs.Mod(rest, sympy.Integer(o))
    return exprs.FloorDiv(rest, exprs.as_expr(stride))


class _Inliner:
    """Forwards a consumer's ops to a recorder, replacing loads of ``buffer`` by the producer."""

    def __init__(self, recorder: BodyRecorder, producer: ComputeNode, buffer: str, tag: str):
        self.recorder = recorder
        self.producer = producer
        self.buffer = buffer
        self.tag = tag
        self.count = 0

    def __getattr__(self, name: str) -> Any:
        return getattr(self.recorder, name)

    def load(self, buf: str, index: Any) -> Any:
        if buf == self.buffer:
            return self._inline(index, None)
        return self.recorder.load(buf, index)

    def masked_load(self, buf: str, index: Any, mask: Any) -> Any:
        if buf == self.buffer:
            value = self._inline(index, mask)
            dtype = self.recorder.body.ops[value.index].dtype
            return self.recorder.where(mask, value, self.recorder.constant(0, dtype))
        return self.recorder.masked_load(buf, index, mask)

    def _inline(self, index: Any, mask: Any) -> Any:
        subs: dict[Any, Any] = {}
        producer_vars = _producer_vars(self.producer) or []
        for v, stride, size in producer_vars:
            subs[v] = exprs.simplify(_recovered(index, stride, size, producer_vars), self.recorder.var_sizes)
        if mask is not None and any(e.atoms(exprs.FloorDiv, exprs.Mod) for e in subs.values()):
            split = _split_under_mask(index, producer_vars, _mask_bounds(self.recorder.body, mask),
                                      self.recorder.var_sizes)
            subs = split if split is not None else subs
        self.count += 1
        replay = _Replay(self.recorder, mask, subs, f"{self.tag}_{self.count}")
        self.producer.body.run(replay, subs)
        return replay.stored


class _Replay:
    """Runs the producer's body into the consumer's recorder; its store becomes the result."""

    def __init__(self, recorder: BodyRecorder, mask: Any, subs: dict[Any, Any], tag: str):
        self.recorder, self.mask, self.subs, self.tag = recorder, mask, subs, tag
        self.stored = None

    def __getattr__(self, name: str) -> Any:
        return getattr(self.recorder, name)

    def load(self, buf: str, index: Any) -> Any:
        if self.mask is not None:
            return self.recorder.masked_load(buf, index, self.mask)
        return self.recorder.load(buf, index)

    def masked_load(self, buf: str, index: Any, mask: Any) -> Any:
        return self.recorder.masked_load(buf, index, self._masked(mask))

    def _masked(self, mask: Any) -> Any:
        if self.mask is None or mask is None:
            return self.mask if mask is None else mask
        return self.recorder.logical_and(self.mask, mask)

    # (the producer's loads read 0 where the consumer's mask is false: checks skip those points)
    def check_bounds(self, value: Any, size: Any, negative: bool, site: str, mask: Any = None) -> Any:
        return self.recorder.check_bounds(value, size, negative, site, self._masked(mask))

    def check_nonzero(self, value: Any, site: str, mask: Any = None) -> Any:
        return self.recorder.check_nonzero(value, site, self._masked(mask))

    def indirect_indexing(self, value: Any, size: Any, name: str) -> sympy.Symbol:
        # Each inlined copy gets its own symbol; later index expressions of the copy use it.
        new = self.recorder.indirect_indexing(value, size, f"{name}_{self.tag}")
        self.subs[exprs.symbol(name)] = new
        return new

    def store(self, buf: str, index: Any, value: Any) -> None:
        self.stored = value


def inline_into(consumer: ComputeNode, producer: ComputeNode, buffer: str, program: LoopProgram) -> ComputeNode:
    """A copy of ``consumer`` that recomputes ``producer`` instead of loading ``buffer``."""
    old = consumer.body
    body = LoopBody(old.sizes, old.reduction_sizes)
    recorder = BodyRecorder(body, lambda b: program.buffers[b].dtype)
    old.run(_Inliner(recorder, producer, buffer, f"{producer.name}_{consumer.name}"))
    meta = dict(consumer.meta)
    meta["origins"] = list(consumer.meta.get("origins", [])) + [
        f"(recomputed) {o}" for o in producer.meta.get("origins", [])]
    return ComputeNode(consumer.name, body, meta)


def _outer_loops_of(p: ComputeNode, r: ComputeNode) -> bool:
    """Whether ``p`` runs over the leading loops of ``r`` (rsqrt(var) of a layer norm feeding
    the per-element normalisation): fusion over the outer loops beats recomputing it per element."""
    outer, inner = p.body.sizes, r.body.sizes + r.body.reduction_sizes
    return len(outer) < len(inner) and all(exprs.equal(a, b) for a, b in zip(outer, inner))


INLINED_BODY_LIMIT = 8  # a consumer stops taking recomputed producers at this many times max_inline_ops

# Ops that cost tens of cycles a value (a polynomial or a library call), unlike the arithmetic,
# selects and loads that recomputing is meant for.
TRANSCENDENTAL_OPS = frozenset({
    "exp", "exp2", "expm1", "log", "log2", "log10", "log1p", "sin", "cos", "tan", "asin", "acos", "atan",
    "atan2", "sinh", "cosh", "tanh", "asinh", "acosh", "atanh", "erf", "erfc", "erfinv", "lgamma", "pow",
    "sigmoid"})


def _static_points(sizes: Sequence[Any]) -> int | None:
    total = sympy.Integer(1)
    for s in sizes:
        total *= exprs.as_expr(s)
    return int(total) if total.is_Integer else None


# A producer with transcendental ops is stored once when its consumer would recompute each of its
# values at least this many times (Inductor stores a buffer read this many times, too).
RECOMPUTE_FACTOR_LIMIT = 4


def _recomputes_transcendentals(r: ComputeNode, p: ComputeNode, buf: str) -> bool:
    """Whether recomputing ``p`` inside ``r`` would run its transcendental ops RECOMPUTE_FACTOR_LIMIT
    times or more per stored value: ``r`` broadcasts it (rotary embeddings' cos and sin of the
    positions, read by every head and batch row) or reads it at several positions per point."""
    if not any(op.name in TRANSCENDENTAL_OPS for op in p.body.ops):
        return False
    produced = _static_points(p.body.sizes)
    consumed = _static_points(r.body.sizes + r.body.reduction_sizes)
    if produced is None or consumed is None:
        return False  # symbolic sizes: no count to compare; recompute as before
    loads = sum(1 for b, _, _ in r.body.reads() if b == buf)
    return loads * consumed >= RECOMPUTE_FACTOR_LIMIT * produced


def _inlined_size(r: ComputeNode, p: ComputeNode, buf: str) -> int:
    """Ops of ``r``'s body once ``p`` is recomputed at each of its loads of ``buf``."""
    loads = sum(1 for b, _, _ in r.body.reads() if b == buf)
    return len(r.body.ops) + loads * len(p.body.ops)


def can_inline(p: ComputeNode, outputs: set[str]) -> bool:
    if p.kind != "pointwise" or len(p.body.ops) > config.max_inline_ops:  # longer ones are stored
        return False
    if p.body.accumulates:  # a scatter-add: no one point of it gives an element's value
        return False
    writes = p.body.writes()
    return len(writes) == 1 and writes[0][0] not in outputs and _producer_vars(p) is not None


def inline_pointwise(program: LoopProgram, decisions: list[Any]) -> LoopProgram:
    """A copy of ``program`` where cheap pointwise producers are recomputed by the consumers
    that could not share their kernel; producers nobody reads any more are dropped."""
    from fireclay_loops.scheduler import Decision, legal_merge, single_group

    position = {n.name: k for k, n in enumerate(program.nodes)}
    outputs = program.output_buffers()
    # The current version of each node by name, in program order, and who reads each buffer:
    # both kept up to date as consumers are replaced, instead of searching and re-walking every
    # body per producer (a scan of every node per producer is quadratic in the model's size).
    alive = {n.name: n for n in program.nodes}
    readers_of: dict[str, set[str]] = {}
    for n in program.nodes:
        for b in n.read_buffers():
            readers_of.setdefault(b, set()).add(n.name)
    # Consumers before their producers: once a producer is recomputed inside its consumers, the
    # producer's own producers see those consumers as their readers (batch norm -> relu -> max
    # pool: relu, then the normalisation, are recomputed in the pooling windows).
    for name in [n.name for n in reversed(program.nodes)]:
        # look the node up again: an earlier inlining may have replaced it by a new version
        p = alive[name]
        if not isinstance(p, ComputeNode) or not can_inline(p, outputs):
            continue
        buf = p.body.writes()[0][0]
        readers = [alive[r] for r in sorted(readers_of.get(buf, ()), key=position.__getitem__)]
        if not readers or not all(isinstance(r, ComputeNode) for r in readers):
            continue
        for r in readers:
            if not isinstance(r, ComputeNode) or _outer_loops_of(p, r):
                continue  # a per-row value: it joins the consumer's kernel over the outer loops
            merged, reason = legal_merge(single_group(p, position[p.name]), single_group(r, position[r.name]), position)
            if merged is not None:
                continue  # the scheduler can fuse them: nothing to recompute
            if _inlined_size(r, p, buf) > INLINED_BODY_LIMIT * config.max_inline_ops:
                continue  # the consumer has grown enough: this producer is stored
            if _recomputes_transcendentals(r, p, buf):
                decisions.append(Decision("keep apart", p.name, r.name, "recompute",
                                          f"{reason}; recomputing would repeat its transcendental ops"))
                continue
            new = alive[r.name] = inline_into(r, p, buf, program)
            for b in r.read_buffers():
                readers_of[b].discard(r.name)
            for b in new.read_buffers():
                readers_of.setdefault(b, set()).add(r.name)
            decisions.append(Decision("inline", p.name, r.name, "recompute", f"{reason}; recomputed instead"))
        if not readers_of.get(buf):
            del alive[p.name]
            for b in p.read_buffers():
                readers_of[b].discard(p.name)
    nodes = list(alive.values())
    kept = {b for n in nodes for b in n.read_buffers() + n.write_buffers()} | set(program.inputs)
    return LoopProgram({b: v for b, v in program.buffers.items() if b in kept}, nodes, list(program.inputs),
                       dict(program.symbols), program.seed, set(program.donated),
                       dict(program.input_specs), dict(program.weights))


# -- the producer's index of a masked load
#
# A load the consumer masks (a padded window: pooling, convolution-like shifts) may address
# points before or after the producer's buffer, where the mask is false. ``(index // stride) %
# size`` cannot simplify there (index - 1 may be negative), and the div/mod it leaves keeps the
# consumer's loop from vectorising. Where the mask bounds each per-dimension part of the index,
# the parts are the producer's variables themselves.


def _mask_bounds(body: LoopBody, mask: Any) -> list[tuple[str, sympy.Expr, sympy.Expr]]:
    """The bounds a mask of ``and``-ed comparisons states: ``(">=", expr, c)`` for ``expr >= c``
    and ``("<", expr, n)`` for ``expr < n`` (index expressions against constants or index
    expressions); other conjuncts state nothing usable and are left out."""
    out: list[tuple[str, sympy.Expr, sympy.Expr]] = []

    def index_of(v: Any) -> sympy.Expr | None:
        op = body.ops[v.index]
        while op.name == "to_dtype":
            op = body.ops[op.args[0].index]
        if op.name == "index_expr":
            return exprs.as_expr(op.args[0])
        if op.name == "constant" and isinstance(op.args[0], int) and not isinstance(op.args[0], bool):
            return sympy.Integer(op.args[0])
        return None

    stack = [mask]
    while stack:
        op = body.ops[stack.pop().index]
        if op.name == "logical_and":
            stack.extend(op.args)
            continue
        kind = {"ge": ">=", "lt": "<", "gt": ">", "le": "<="}.get(op.name)
        if kind is None:
            continue
        a, b = (index_of(x) for x in op.args)
        if a is None or b is None:
            continue
        if kind == ">":
            kind, b = ">=", b + 1
        elif kind == "<=":
            kind, b = "<", b + 1
        out.append((kind, a, b))
    return out


def _split_under_mask(index: Any, producer_vars: Sequence[tuple[sympy.Symbol, sympy.Expr, sympy.Expr]],
                      bounds: list[tuple[str, sympy.Expr, sympy.Expr]],
                      var_sizes: dict[str, Any]) -> dict[Any, Any] | None:
    """The producer's variables as the parts of ``index`` along its strides (each term goes to
    the largest stride dividing it; the constant is shared out among the strides, trying each
    way that rounds down or up), when every part lies inside its dimension wherever the mask
    holds: inside over the loop ranges, or bounded by a conjunct of the mask. None when no
    split can be shown to."""
    strides = []
    for v, stride, size in producer_vars:
        st, n = exprs.to_static(stride), exprs.to_static(size)
        if st is None or n is None or st <= 0:
            return None
        strides.append((v, st, n))
    order = sorted(strides, key=lambda t: -t[1])
    parts: dict[Any, sympy.Expr] = {v: sympy.Integer(0) for v, _, _ in strides}
    constant = 0
    loop_vars = {exprs.symbol(name) for name in var_sizes}
    for term in sympy.Add.make_args(sympy.expand(exprs.as_expr(index))):
        coeff, rest = term.as_coeff_Mul()
        if not coeff.is_Integer:
            return None
        c = int(coeff)
        if rest == 1:
            constant += c
            continue
        if not isinstance(rest, sympy.Symbol) or rest not in loop_vars:
            return None
        home = next(((v, st) for v, st, _ in order if c % st == 0), None)
        if home is None:
            return None
        parts[home[0]] += sympy.Integer(c // home[1]) * rest
    ranges = {exprs.symbol(name): exprs.to_static(n) for name, n in var_sizes.items()}

    def inside(part: sympy.Expr, n: int) -> bool:
        low_high = _affine_range(part, ranges)
        if low_high is None:
            return False
        low, high = low_high
        if low < 0 and not any(k == ">=" and c.is_Integer and (shift := _shift(e, part)) is not None
                               and int(c) - shift >= 0 for k, e, c in bounds):
            return False
        return high < n or any(k == "<" and c.is_Integer and (shift := _shift(e, part)) is not None
                               and int(c) - shift <= n for k, e, c in bounds)

    def share(k: int, rest: int, chosen: dict[Any, sympy.Expr]) -> dict[Any, sympy.Expr] | None:
        if k == len(order):
            return chosen if rest == 0 else None
        v, st, n = order[k]
        q = rest // st
        for take in (q, q + 1) if rest % st and k + 1 < len(order) else (q,):
            part = parts[v] + take
            if inside(part, n):
                found = share(k + 1, rest - take * st, {**chosen, v: part})
                if found is not None:
                    return found
        return None

    return share(0, constant, {})


def _shift(e: sympy.Expr, part: sympy.Expr) -> int | None:
    """``e - part`` when it is an integer constant."""
    d = sympy.expand(e - part)
    return int(d) if d.is_Integer else None


def _affine_range(e: sympy.Expr, ranges: dict[sympy.Symbol, int | None]) -> tuple[int, int] | None:
    """Least and greatest value of affine ``e`` over variables ranging ``0 .. n - 1``."""
    low = high = 0
    for term in sympy.Add.make_args(sympy.expand(e)):
        coeff, rest = term.as_coeff_Mul()
        if not coeff.is_Integer:
            return None
        if rest == 1:
            low, high = low + int(coeff), high + int(coeff)
            continue
        n = ranges.get(rest) if isinstance(rest, sympy.Symbol) else None
        if n is None:
            return None
        span = int(coeff) * (n - 1)
        low, high = low + min(0, span), high + max(0, span)
    return low, high
