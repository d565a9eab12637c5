"""Column reductions of the C++ backend: a reduction whose memory is contiguous along the
innermost kept dim and strided along the reduced one (a bias gradient, the column sums of a
``[rows, cols]`` tensor). They run the other way round: the kept dim goes in blocks, one accumulator per point of the block, the
reduction loop outside and an ``omp simd`` loop over the block inside, so every load reads
consecutive addresses instead of gathering one per lane. A block is as wide as the kept dim (up
to :data:`COLUMN_BLOCK` points and :data:`COLUMN_BLOCK_BYTES` of accumulators): the reduction
loop then walks whole rows, in memory order; blocks of part of a row make each pass over the
rows skip through memory, which measured up to twice as slow once the rows leave the cache
(a layer-norm weight gradient over 4096 x 768). When there are fewer blocks than threads at
run time, the blocks are narrowed then, so that every thread has one. A kernel's
later loops over ``r`` (batch norm's backward over channels-last memory: the input gradient
needs the per-channel sums of the first loop) run the same way, block by block. Welford's
statistics take two loops over ``r``, as in row kernels: a sum for the mean, then the squared
deviations from it (the online update divides per element, in a chain through the running mean
that a block of one vector cannot hide: batch norm over 16 channels).
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING

import sympy

from fireclay_cpp.op_templates import Accumulator, CValue
from fireclay_cpp.prelude import CTYPES
from fireclay_loops.backend import Scope, StagePlan, access, indent
from fireclay_loops.backend.reductions import REDUCTIONS
from fireclay_loops.dtypes import ITEMSIZE

if TYPE_CHECKING:
    from fireclay_cpp.kernel_codegen import CppKernelGen, KernelSource

COLUMN_BLOCK = 4096  # most kept-dim points per block of a column reduction (accumulators live in arrays)
COLUMN_BLOCK_BYTES = 32 * 1024  # most bytes of a column block's accumulator arrays (on the stack)
COLUMN_MIN_BLOCK = 16  # narrowest block when blocks are narrowed for threads (two AVX2 float vectors)


def reads_columns(gen: CppKernelGen) -> bool:
    """Whether this reduction's memory runs along the innermost kept dim (see the kit's
    :func:`~fireclay_loops.backend.access.reads_columns`)."""
    return access.reads_columns(gen.accesses, gen.kernel.xvars, gen.kernel.rvars, gen.hint)


def column_function(gen: CppKernelGen, xs, rs, stages: list[StagePlan]) -> KernelSource:
    """The kernel with the innermost kept dim in blocks: for each block, every stage's loop
    over ``r`` runs outside and an ``omp simd`` loop over the block's points inside it (see
    the module docstring), so each load of each loop reads consecutive addresses.
    ``stages``: where each stage's values go (before, in or after its loop). Around each
    loop, a loop over the block's points computes once per point what comes after a
    reduction (its result, its stores) and what the next loop needs that does not change
    along ``r`` (a per-channel scale of batch norm's backward, a mask of a concatenation),
    into arrays that loop reads. A later loop recomputes what it needs of an earlier one."""
    k = gen.kernel
    nx = len(xs)
    last, extent = f"x{nx - 1}", xs[-1]
    width = column_block(gen)
    if extent.isdigit():
        width = min(width, int(extent))  # (fewer columns than a block: one block of them all)
    arrays: list[str] = []
    restore: dict[Accumulator, str] = {}
    count = " * ".join(f"({r})" for r in rs) or "1"
    for a in gen.accumulators:
        if a.plain_sum:
            a.add_stmt.code = f"{a.name}_col[fc_i] += ({a.ctype})({a.value.name});"
            arrays += [f"{a.ctype} {a.name}_col[{width}];",
                       f"for (int64_t fc_i = 0; fc_i < {width}; fc_i++) {a.name}_col[fc_i] = 0;"]
            restore[a] = f"{a.decl_type} {a.name}; {a.name}.v = {a.name}_col[fc_i];"
        elif a.kind == "welford":
            # two passes, as in row kernels (see _welford_second_pass): a sum, then the squared
            # deviations from its mean; Welford's online update divides per element in a chain
            # through the running mean, one vector a row when the block is one vector wide
            a.add_stmt.code = f"{a.name}_col[fc_i] += ({a.ctype})({a.value.name});"
            arrays += [f"{a.ctype} {a.name}_{part}[{width}];" for part in ("col", "mean", "m2")]
            arrays.append(f"for (int64_t fc_i = 0; fc_i < {width}; fc_i++) {a.name}_col[fc_i] = {a.name}_m2[fc_i] = 0;")
            restore[a] = (f"{a.decl_type} {a.name}; {a.name}.mean = {a.name}_mean[fc_i]; {a.name}.m2 = {a.name}_m2[fc_i]; "
                          f"{a.name}.n = ({a.ctype})({count});")
        else:
            a.add_stmt.code = a.add_stmt.code.replace(f"{a.name}.add(", f"{a.name}_col[fc_i].add(", 1)
            arrays.append(f"{a.decl_type} {a.name}_col[{width}];")
            restore[a] = f"{a.decl_type} {a.name} = {a.name}_col[fc_i];"
    point = [f"const int64_t {last} = fc_xb + fc_i;"]

    def over_block(lines: list[str], simd: bool = False) -> list[str]:
        head = ["#pragma omp simd"] if simd else []
        return head + ["for (int64_t fc_i = 0; fc_i < fc_xn; fc_i++) {"] + indent(point + lines) + ["}"]

    body = gen.parallel("#pragma omp parallel for", nx)
    narrowed = bool(body) and few_column_blocks(gen, width)  # then the points per block are fc_w
    step = "fc_w" if narrowed else width
    rheads = [f"for (int64_t r{d} = 0; r{d} < {rs[d]}; r{d}++) {{" for d in range(len(rs))]
    if not narrowed and extent.isdigit() and int(extent) % width == 0:
        block = [f"const int64_t fc_xn = {width};"]  # (a constant trip count: no remainder loop)
    else:
        block = [f"const int64_t fc_xn = ({extent}) - fc_xb < {step} ? ({extent}) - fc_xb : {step};"]
    block += arrays
    kept: dict[CValue, None] = {}  # values some loop reads per point from an array
    done: list[Accumulator] = []  # accumulators whose loop has run: each per-point scope restores them
    points = Scope()
    lanes = _LaneDependence(last)
    for plan in stages:
        rows = Scope()  # per point of the reduction loop, before the loop over the block
        loop, needed = Scope(parent=rows), []
        points.place_all(plan.before)
        for v in plan.in_loop:
            _place_in_column_loop(v, loop, rows, points, needed, lanes)
        points.lines += [f"{v.name}_col[fc_i] = {v.name};" for v in needed]
        kept.update(dict.fromkeys(needed))
        if loop.lines:
            if points.lines:
                block += over_block([restore[a] for a in done] + points.lines)
            block += rheads + indent(rows.lines + over_block(loop.lines, simd=True)) + ["}"] * len(rheads)
            welford = [a for a in gen.accumulators if a.add_stmt in loop.seen and a.kind == "welford"]
            if welford:
                block += _welford_deviations(welford, count, rheads, over_block, kept, lanes, done, restore)
            done += [a for a in gen.accumulators if a.add_stmt in loop.seen]
            points = Scope()
        points.place_all(plan.after)
    if points.lines:
        block += over_block([restore[a] for a in done] + points.lines)
    block[1:1] = [f"{v.ctype} {v.name}_col[{width}];" for v in kept]
    heads = [f"for (int64_t x{d} = 0; x{d} < {xs[d]}; x{d}++) {{" for d in range(nx - 1)]
    heads.append(f"for (int64_t fc_xb = 0; fc_xb < {extent}; fc_xb += {step}) {{")
    if narrowed:
        body[:0] = narrowed_block(gen, xs, width, k.numel * k.rnumel)
    body += heads + indent(block) + ["}"] * nx
    return gen.source(body)

def _welford_deviations(accs: list[Accumulator], count: str, rheads: list[str], over_block, kept: dict[CValue, None],
                        lanes: _LaneDependence, done: list[Accumulator], restore: dict[Accumulator, str]) -> list[str]:
    """Lines of a column kernel's second pass for Welford accumulators: each point's mean from
    the first loop's sums, then a loop over ``r`` (the values computed again) summing the
    squared deviations from it."""
    lines = over_block([f"{a.name}_mean[fc_i] = ({count}) > 0 ? {a.name}_col[fc_i] / ({a.ctype})({count}) : "
                        f"({a.ctype})(0);" for a in accs])
    rows, before = Scope(), Scope()
    loop, needed = Scope(parent=rows), []
    for a in accs:
        t = a.ctype
        dev = CValue(name=f"{a.name}_dev", code=f"{t} {a.name}_dev = ({t})({a.value.name}) - {a.name}_mean[fc_i]; "
                     f"{a.name}_m2[fc_i] += {a.name}_dev * {a.name}_dev;", deps=[a.value], varying=True)
        _place_in_column_loop(dev, loop, rows, before, needed, lanes)
    if before.lines:
        lines += over_block([restore[a] for a in done] + before.lines + [f"{v.name}_col[fc_i] = {v.name};" for v in needed])
    kept.update(dict.fromkeys(needed))
    return lines + rheads + indent(rows.lines + over_block(loop.lines, simd=True)) + ["}"] * len(rheads)


def column_block(gen: CppKernelGen) -> int:
    """Points per block (the size of its accumulator arrays): the whole kept dim, at its
    hint, rounded up to :data:`COLUMN_MIN_BLOCK`, within :data:`COLUMN_BLOCK` points and
    :data:`COLUMN_BLOCK_BYTES` of accumulators."""
    per_point = sum(_accumulator_bytes(a) for a in gen.accumulators) or 1
    fits = max(COLUMN_MIN_BLOCK, COLUMN_BLOCK_BYTES // per_point // COLUMN_MIN_BLOCK * COLUMN_MIN_BLOCK)
    extent = -(-gen.hint(gen.kernel.xsizes[-1]) // COLUMN_MIN_BLOCK) * COLUMN_MIN_BLOCK
    return max(COLUMN_MIN_BLOCK, min(COLUMN_BLOCK, fits, extent))

def few_column_blocks(gen: CppKernelGen, width: int) -> bool:
    """Whether blocks of ``width`` points may leave threads idle (fewer blocks than the
    threads planned for, at the size hints): then the width is chosen again at run time."""
    k = gen.kernel
    outer = gen.hint(sympy.Mul(*k.xsizes[:-1]))
    return outer * -(-gen.hint(k.xsizes[-1]) // width) < gen.threads

def narrowed_block(gen: CppKernelGen, xs: list[str], width: int, work: sympy.Expr) -> list[str]:
    """C++ that sets ``fc_w``, the points per block: ``width``, or where that gives fewer
    blocks than OpenMP has threads, each row's share of one thread (down to
    :data:`COLUMN_MIN_BLOCK`). With one thread the blocks stay whole rows."""
    outer = " * ".join(f"({x})" for x in xs[:-1]) or "1"
    extent = xs[-1]
    parallel = "" if work.is_Integer else f" && ({gen.index(work)}) >= {gen.PARALLEL_MIN_WORK}"
    m = COLUMN_MIN_BLOCK
    return [
        f"int64_t fc_w = {width};",
        "{",
        "  const int64_t fc_nt = omp_get_max_threads();",
        f"  const int64_t fc_outer = {outer};",
        f"  if (fc_outer * ((({extent}) + {width} - 1) / {width}) < fc_nt{parallel}) {{",
        "    const int64_t fc_pieces = (fc_nt + fc_outer - 1) / fc_outer;  // blocks per row",
        f"    fc_w = ((({extent}) + fc_pieces - 1) / fc_pieces + {m - 1}) / {m} * {m};",
        f"    fc_w = fc_w < {m} ? {m} : (fc_w > {width} ? {width} : fc_w);",
        "  }",
        "}",
    ]

def _accumulator_bytes(acc: Accumulator) -> int:
    """Bytes one point of ``acc`` takes in a column block's array (its accumulator struct)."""
    return REDUCTIONS[acc.kind].state_bytes(_CTYPE_BYTES[acc.ctype])


# (the compute types are the storage types of the dtypes that are computed in their own type)
_CTYPE_BYTES = {compute: ITEMSIZE[dtype] for dtype, (storage, compute) in CTYPES.items() if storage == compute}


class _LaneDependence:
    """Which values of a column kernel change along its vectorised loop, the block's points
    (``lane``, the innermost kept variable): those naming it, an accumulator's (one per point)
    and what reads them. A load or select under a mask that does not change along it takes its
    column form (``CValue.column_form``: an unconditional read inside the buffer and a bit
    blend), as loops under an invariant mask do in row kernels."""

    def __init__(self, lane: str):
        self.name = re.compile(rf"\b{lane}\b|\bfc_i\b")
        self.known: dict[CValue, bool] = {}

    def __call__(self, v: CValue) -> bool:
        found = self.known.get(v)
        if found is None:
            if v.column_form is not None and not self(v.column_form[2]):
                v.code, v.deps = v.column_form[0], list(v.column_form[1])
                v.column_form = None
            found = v.acc is not None or bool(self.name.search(v.code)) or any(self(d) for d in v.deps)
            self.known[v] = found
        return found


def _place_in_column_loop(v: CValue, loop: Scope, rows: Scope, before: Scope, kept: list[CValue],
                          lanes: _LaneDependence) -> None:
    """Declare ``v`` in the reduction loop of a column kernel: a value that does not change
    along the reduction (and is not a constant) is computed in ``before``, once per point, and
    read back from its array (listed in ``kept``); one that changes along the reduction but not
    along the block (a padded window's mask) once per point of the reduction, in ``rows``
    (``loop``'s parent: the reduction loop's body, before the loop over the block)."""
    if loop.visible(v):
        return
    if not v.in_loop() and (v.deps or v.acc is not None):  # (an earlier loop's result too)
        before.place(v)
        kept.append(v)
        loop.lines.append(f"{v.ctype} {v.name} = {v.name}_col[fc_i];")
        loop.seen.add(v)
        return
    lane_dependent = lanes(v)
    if not lane_dependent and not _reads_per_point(v):
        rows.place(v)
        return
    for d in v.deps:
        _place_in_column_loop(d, loop, rows, before, kept, lanes)
    if v.code:
        loop.lines.append(v.code)
    loop.seen.add(v)


def _reads_per_point(v: CValue) -> bool:
    """Whether ``v`` reads, directly or not, an accumulator's result or a value computed once per
    point of the block (read inside the loop from its array)."""
    stack, seen = [v], set()
    while stack:
        d = stack.pop()
        if d not in seen:
            if d.acc is not None or (not d.in_loop() and d.deps):
                return True
            seen.add(d)
            stack.extend(d.deps)
    return False



