"""Long reductions with few outputs, scheduled so that a GPU backend can spread them over its
programs (``config.split_reductions`` names the device types; ``schedule(...,
split_reductions=True)`` asks for it whatever the device).

A reduction kernel runs one program per row (or per block of columns) of its outputs. With few
outputs and a long reduction (batch norm's per-channel sums over N*H*W, a loss summed to a
scalar) that is a handful of programs on a GPU of a hundred multiprocessors. fireclay-triton
then *splits* the reduction: each program reduces one chunk into a workspace, and a small
kernel combines the chunks in a fixed order (no atomics) and runs the code that follows on the
outputs alone. :func:`few_outputs` is the shape test both packages use. Two things a schedule
can do stop the split, and the scheduler avoids them here:

* **an epilogue inside the reduction loop**: a node over the whole iteration space that reads
  the reduction's result (batch norm's input gradient reads both per-channel sums). It needs
  the finished result in every chunk, so :func:`epilogue_in_loop` refuses that fusion; the
  epilogue becomes a pointwise kernel over every element that reads the (small) results from
  memory: the same traffic as a second loop in the reduction kernel, on every program.
* **a scalar reduction of what a row kernel computes** (softmax backward's sum of grad * x,
  the gradient of a scale): the row kernel would store the whole tensor for the scalar kernel
  to read back. :func:`split_scalar_reductions` rewrites such a reduction as per-row partial
  results over the row kernel's iteration space (which then fuses into it) and a reduction of
  the partials to the scalar.
"""

from __future__ import annotations

from typing import Any

import sympy

from fireclay_loops import exprs
from fireclay_loops.body import BodyRecorder, BodyValue, LoopBody
from fireclay_loops.config import config
from fireclay_loops.ir import Buffer, ComputeNode, LoopProgram

SPLIT_MAX_OUTER = 16384  # column reductions of at most this many outputs...
SPLIT_MIN_REDUCTION = 4096  # ...at least this long (and 4x longer than the outputs) are split
FEW_ROWS = 64  # any reduction of at most this many outputs...
LONG_ROW = 32768  # ...and at least this long is split (one program per row would idle a GPU)
# reduction types whose partial results (float32) combine exactly as the whole would
SPLITTABLE = frozenset({"sum", "max", "min", "welford"})
SCALAR_SPLITTABLE = frozenset({"sum", "max", "min"})
MAX_PRODUCER_WALK = 32  # nodes visited looking for the row reduction a scalar reduction follows


def unit_stride_var(index: Any, variables: list[sympy.Symbol]) -> sympy.Symbol | None:
    """The variable (innermost first) that moves ``index`` by exactly 1, if any."""
    e = sympy.sympify(index)
    free = e.free_symbols
    for v in reversed(variables):
        if v in free:
            try:
                step = sympy.expand(e.xreplace({v: v + 1}) - e)
            except Exception:  # an index function sympy cannot shift: not provably contiguous
                continue
            if step == 1:
                return v
    return None


def reduces_columns(indices: list[Any], xvars: list[sympy.Symbol], rvars: list[sympy.Symbol]) -> bool:
    """True when no access (index in kernel variables) is contiguous along the reduction and
    some reduced access is contiguous along the outer points (``x.sum(0)``). Accesses that do
    not move with the outer points (a per-row value read beside the columns, like layer norm's
    mean and rstd in its weight gradient) are the same for every output and do not count."""
    if not rvars or not xvars:
        return False
    reduced = [i for i in indices
               if set(rvars) & sympy.sympify(i).free_symbols and set(xvars) & sympy.sympify(i).free_symbols]
    if any(unit_stride_var(i, [rvars[-1]]) is not None for i in reduced):
        return False
    return any(unit_stride_var(i, [xvars[-1]]) is not None for i in reduced)


def few_outputs(numel: Any, rnumel: Any, columns: bool) -> bool:
    """Whether a reduction of ``numel`` outputs over ``rnumel`` points is split over programs:
    few long rows, or (contiguous along the outputs) a long column reduction."""
    n, r = exprs.to_static(numel), exprs.to_static(rnumel)
    if n is None or r is None:
        return False
    if n <= FEW_ROWS and r >= LONG_ROW:
        return True
    return columns and n <= SPLIT_MAX_OUTER and r >= max(SPLIT_MIN_REDUCTION, 4 * n)


# --------------------------------------------------------------------------- epilogues


def _reduction_ops(node: ComputeNode) -> list[Any]:
    return [op for op in node.body.ops if op.name == "reduction"]


def epilogue_in_loop(group: Any) -> str | None:
    """Why ``group`` (a candidate kernel: ``nodes`` in order, ``var_maps``, ``xsizes``,
    ``rsizes``, ``accesses``) would keep a reduction with few outputs on few programs: a node
    over its reduction loop reads a reduction result of the group. None when it is fine: no such
    node, a shape that is not split anyway, or a reduction a split cannot combine."""
    if not group.rsizes:
        return None
    reductions = [op for n in group.nodes for op in _reduction_ops(n)]
    if not reductions or any(op.args[2] not in SPLITTABLE or op.args[0] != "float32" for op in reductions):
        return None
    rvars = {exprs.symbol(f"r{k}") for k in range(len(group.rsizes))}
    stage_of: dict[str, tuple[int, bool]] = {}  # buffer -> (its writer's stage, writer is a reduction)
    late = None
    for n in group.nodes:
        stage = 0
        for b, _, _ in n.body.reads():
            found = stage_of.get(b)
            if found is not None:
                stage = max(stage, found[0] + (1 if found[1] else 0))
        over_r = any(rvars & e.free_symbols for e in group.var_maps[n.name].values())
        if stage > 0 and over_r:
            late = n
            break
        for b, _, _ in n.body.writes():
            stage_of[b] = (stage, n.kind == "reduction")
    if late is None:
        return None
    xvars = [exprs.symbol(f"x{k}") for k in range(len(group.xsizes))]
    indices = [i for _, i, _ in group.accesses("read") + group.accesses("write")]
    columns = reduces_columns(indices, xvars, sorted(rvars, key=lambda v: v.name))
    if not few_outputs(exprs.product(group.xsizes), exprs.product(group.rsizes), columns):
        return None
    return (f"{late.name} runs over the reduction loop after a reduction with few outputs, which then could not be "
            "split over programs")


def recompute_for_epilogue(state: Any, a: Any, b: Any) -> bool:
    """After the epilogue fusion of groups ``a`` and ``b`` was refused (:func:`epilogue_in_loop`):
    the epilogue group recomputes the cheap pointwise values it reads from the reduction's
    group over the reduction loop (batch norm's ``x - mean``, a ReLU's gradient mask), through
    chains of them, instead of the reduction kernel storing them for it. Replaces the epilogue
    group in ``state.groups``; True when anything was recomputed."""
    from fireclay_loops.inline import INLINED_BODY_LIMIT, _inlined_size, can_inline, inline_into
    from fireclay_loops.scheduler import Decision, Group

    source, epilogue = (a, b) if a.writes() & b.reads() else (b, a)
    rvars = {exprs.symbol(f"r{k}") for k in range(len(source.rsizes))}
    outputs = state.program.output_buffers()
    writer = {}
    for n in source.nodes:
        over_r = any(rvars & e.free_symbols for e in source.var_maps[n.name].values())
        if n.kind == "pointwise" and over_r and can_inline(n, outputs):
            writer[n.body.writes()[0][0]] = n
    nodes = list(epilogue.nodes)
    changed, progress = False, True
    while progress:
        progress = False
        for k, n in enumerate(nodes):
            for buf in dict.fromkeys(n.read_buffers()):
                p = writer.get(buf)
                if p is None or _inlined_size(n, p, buf) > INLINED_BODY_LIMIT * config.max_inline_ops:
                    continue
                n = nodes[k] = inline_into(n, p, buf, state.program)
                state.decisions.append(Decision("inline", p.name, n.name, "recompute",
                                                "the epilogue of a reduction split over programs recomputes it"))
                progress = changed = True
    if not changed:
        return False
    replaced = Group(nodes, list(epilogue.xsizes), list(epilogue.rsizes), dict(epilogue.var_maps), epilogue.order)
    state.groups = [replaced if g is epilogue else g for g in state.groups]
    return True


# --------------------------------------------------------------------------- scalar reductions


def _scalar_reduction(node: Any) -> int | None:
    """The position of the reduction op of a reduction to one value that can be computed from
    partial results: one sum/max/min whose result the rest of the body only finishes and stores."""
    if not isinstance(node, ComputeNode) or node.kind != "reduction" or node.body.vars:
        return None
    ops = node.body.ops
    found = [k for k, op in enumerate(ops) if op.name == "reduction"]
    if len(found) != 1 or ops[found[0]].args[2] not in SCALAR_SPLITTABLE:
        return None
    k = found[0]
    rvars = set(node.body.reduction_vars)
    for op in ops[k + 1:]:
        for a in op.args:
            if isinstance(a, BodyValue) and a.index < k:
                return None  # the finishing code reads a value of the reduced loop
            if isinstance(a, sympy.Basic) and a.free_symbols & rvars:
                return None
    if any(exprs.to_static(s) is None for s in node.body.reduction_sizes):
        return None
    return k


def _row_reduction_feeding(node: ComputeNode, writers: dict[str, ComputeNode]) -> ComputeNode | None:
    """A reduction over rows (outer loops and a reduction) whose iteration space holds exactly
    the points ``node`` reduces, found among the producers of what ``node`` reads (through
    pointwise nodes): the kernel the partial results can join. Not one with few long rows: that
    one is split itself, its epilogue (the partials' producer) in another kernel."""
    total = exprs.product(node.body.reduction_sizes)
    queue, seen = list(node.read_buffers()), set[str]()
    while queue and len(seen) < MAX_PRODUCER_WALK:
        writer = writers.get(queue.pop(0))
        if writer is None or writer.name in seen or writer is node:
            continue
        seen.add(writer.name)
        body = writer.body
        if writer.kind == "reduction":
            sizes = list(body.sizes) + list(body.reduction_sizes)
            if body.sizes and body.reduction_sizes and all(exprs.to_static(s) is not None for s in sizes) \
                    and exprs.equal(exprs.product(sizes), total) and (exprs.to_static(exprs.product(body.sizes)) or 0) > 1 \
                    and not few_outputs(exprs.product(body.sizes), exprs.product(body.reduction_sizes), False):
                return writer
            continue
        queue.extend(writer.read_buffers())
    return None


def _replay(ops: list[Any], recorder: BodyRecorder, results: list[Any], subs: dict[Any, Any]) -> None:
    """Record ``ops`` again, their index expressions rewritten by ``subs``; ``results`` holds
    the new value of each earlier op (appended to as ops are recorded)."""
    def arg(a: Any) -> Any:
        if isinstance(a, BodyValue):
            return results[a.index]
        if isinstance(a, sympy.Basic):
            return a.xreplace(subs)
        return a

    for op in ops:
        results.append(getattr(recorder, op.name)(*(arg(a) for a in op.args)))


def _split(node: ComputeNode, k: int, rows: ComputeNode, program: LoopProgram,
           partial_name: str) -> tuple[ComputeNode, ComputeNode, Buffer]:
    """``node`` as (partials over ``rows``' iteration space, the reduction of the partials)."""
    body, row_body = node.body, rows.body
    acc_dtype, _, kind, _ = body.ops[k].args
    out = program.buffers[body.writes()[0][0]]
    partial = Buffer(partial_name, acc_dtype, out.device, list(row_body.sizes),
                     exprs.contiguous_strides(list(row_body.sizes)))
    dtype_of = lambda b: partial.dtype if b == partial.name else program.buffers[b].dtype  # noqa: E731

    # partial sums: the reduced points numbered row-major over the row kernel's loops
    first = LoopBody(row_body.sizes, row_body.reduction_sizes)
    recorder = BodyRecorder(first, dtype_of)
    flat, ranges = sympy.Integer(0), {}
    for v, n in zip(first.vars + first.reduction_vars, first.sizes + first.reduction_sizes):
        flat = flat * n + v
        ranges[v.name] = n
    subs, inner = {}, sympy.Integer(1)
    for v, n in reversed(list(zip(body.reduction_vars, body.reduction_sizes))):
        subs[v] = exprs.simplify(exprs.modular_indexing(flat, inner, n), ranges)
        inner = inner * n
    results: list[Any] = []
    _replay(body.ops[: k + 1], recorder, results, subs)
    out_index = sum((v * s for v, s in zip(first.vars, partial.stride)), sympy.Integer(0))
    recorder.store_reduction(partial.name, out_index, results[k])

    # the reduction of the partials, finished and stored as ``node`` did
    second = LoopBody([], [exprs.product(partial.size)])
    recorder = BodyRecorder(second, dtype_of)
    value = recorder.load(partial.name, second.reduction_vars[0])
    results = [None] * k + [recorder.reduction(acc_dtype, acc_dtype, kind, value)]
    _replay(body.ops[k + 1:], recorder, results, {})
    meta = dict(node.meta)
    return (ComputeNode(f"{node.name}_rows", first, dict(meta)), ComputeNode(node.name, second, meta), partial)


def split_scalar_reductions(program: LoopProgram, decisions: list[Any]) -> LoopProgram:
    """A copy of ``program`` where each reduction to a scalar of values a row reduction's
    kernel computes is computed as per-row partial results plus their reduction."""
    from fireclay_loops.scheduler import Decision

    writers = {b: n for n in program.nodes if isinstance(n, ComputeNode) for b in n.write_buffers()}
    nodes, buffers, changed = [], dict(program.buffers), False
    for node in program.nodes:
        k = _scalar_reduction(node) if isinstance(node, ComputeNode) else None
        rows = _row_reduction_feeding(node, writers) if k is not None and isinstance(node, ComputeNode) else None
        if rows is None or k is None or not isinstance(node, ComputeNode):
            nodes.append(node)
            continue
        name = f"{node.body.writes()[0][0]}_rows"
        if name in buffers:
            nodes.append(node)
            continue
        first, second, partial = _split(node, k, rows, program, name)
        buffers[partial.name] = partial
        nodes += [first, second]
        changed = True
        decisions.append(Decision("split", node.name, rows.name, "reduction",
                                  f"partial results per row of {rows.name}'s loops ({partial.name}), then their "
                                  "reduction: the partials can share the row kernel"))
    if not changed:
        return program
    return LoopProgram(buffers, nodes, list(program.inputs), dict(program.symbols), program.seed,
                       set(program.donated), dict(program.input_specs), dict(program.weights))
