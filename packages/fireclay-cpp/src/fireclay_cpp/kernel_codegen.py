"""One scheduled kernel as one ``extern "C"`` C++ function.

Built on fireclay-loops' kernel-emission kit (:mod:`fireclay_loops.backend`): node bodies are
replayed on :class:`~fireclay_cpp.op_templates.CppOps`, the op templates, and the kit's scopes
place each C++ declaration where it is first needed, one reduction loop per stage. A value placed
in a loop is recomputed in each later loop that reads it (which is how internal buffers read by
later loops never reach memory), except in rows short enough to keep: see :class:`RowCache`. The
scopes:

* the *outer* scope runs once per point of the outer (``x``) loops: pointwise nodes that do not
  touch a reduction variable, and everything after a reduction loop (its epilogue);
* the *loop* scope is the body of a reduction loop (``r``): what feeds an accumulator, and
  pointwise nodes indexed by ``r``.

Vectorisation: each reduction loop is ``omp simd`` with its accumulators as OpenMP reductions.
Welford's update divides per element and does not vectorise, so outside split reductions it
becomes two passes over the row: a sum for the mean, then a sum of squared deviations.

Column reductions (memory contiguous along the innermost kept dim, strided along the reduced
one) run the other way round: see :mod:`fireclay_cpp.column_loops`.

A kernel that adds into a buffer (``ops.store_add``, a scatter-add) clears the buffer, then
runs serially, without ``omp simd`` either: several points may add at one element, and a serial
loop adds them in index order, as eager's CPU kernel does (an atomic add per element costs a
compare-and-swap loop for floats; these kernels are small: embedding and position-bias
gradients).

Strided reads in pointwise kernels: GCC (12) vectorises no loop that reads memory at a stride
along it, so a pointwise kernel whose innermost loop gathers (a transposed operand: a layer norm
over channels of a ``[batch, channels, time]`` convolution output, a padded or sliced gradient)
would run its whole body scalar, ``erf`` and ``exp`` included. Such reads are gathered first, by
a plain loop over the row, into a local array the vectorised loop then reads in order; so are
those of a row reduction's loop (a layer norm's gradient over a transposed operand; see
:meth:`CppKernelGen._gather_strided_loads`).

Values of a pointwise kernel that change along its innermost loop but not along the outer ones
(batch norm's per-channel ``1 / sqrt(var + eps)`` over channels-last memory) are computed once
per call, before the outer loops, into a local array the innermost loop reads: inside OpenMP's
outlined loop the parameters' ``__restrict__`` is lost, GCC cannot hoist them out of the outer
loops itself, and a square root and a division per element made such a batch norm and SiLU
kernel half as slow again (see :meth:`CppKernelGen._hoist_column_values`).

Masks along the innermost loop of a pointwise kernel (a pad's or a slice's gradient, a
concatenation along the last dim: ``x < 159 ? a : 0``) keep GCC from vectorising it too: with a
call in the loop (``erf``) it does not turn the selects into blends. Such a loop runs as
consecutive loops split where a comparison of the loop variable with a constant changes its
answer: within each, the compiler's range analysis decides every such comparison and the
selects fold away.

Parallelism: the outer loops are an OpenMP ``parallel for`` (all but the innermost for pointwise
kernels, so the innermost stays a plain loop the compiler vectorises). When there are few outer
points and a long reduction, the reduction loop itself is split over threads instead, with
per-thread accumulators merged in thread order (deterministic for a given thread count).
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import sympy

from fireclay_cpp import column_loops
from fireclay_cpp.errors import CodegenError
from fireclay_cpp.op_templates import Accumulator, BoundsCheck, CppOps, CValue, ctype
from fireclay_loops import Kernel, backend
from fireclay_loops.backend import KernelEmitter, Scope, StagePlan, access, indent
from fireclay_shapes import cpp_code

PARALLEL_MIN_WORK = 16384  # points of work below which the OpenMP fork costs more than it saves
SPLIT_REDUCTION_MIN = 4096  # reduction length from which a lone reduction is split over threads
ROW_CACHE_MAX = 1024  # longest reduction row whose values later loops read from a local array
GATHER_ROW_MAX = 4096  # longest innermost loop of a pointwise kernel whose strided reads are gathered first
GATHER_BYTES_MAX = 64 * 1024  # most bytes of gathered rows a kernel keeps on the stack (per thread)
COLUMN_VALUES_BYTES = 32 * 1024  # most bytes of per-column values a pointwise kernel computes before its loops
MAX_LOOP_SPLITS = 4  # most places the innermost loop of a pointwise kernel is split at (see the docstring)
_COMPARE: dict[str, Callable[[int, int], bool]] = {
    "lt": lambda p, q: p < q, "le": lambda p, q: p <= q, "gt": lambda p, q: p > q,
    "ge": lambda p, q: p >= q, "eq": lambda p, q: p == q, "ne": lambda p, q: p != q,
}
_CACHED_TYPES = ("float", "double")
_COLUMN_TYPES = ("float", "double", "int64_t", "int32_t")  # values kept in per-column arrays
# code a value computed once per column must not hold: a kernel check, a random draw (its
# position is the element's), a gathered row (an array of the outer point)
_KEPT_IN_LOOP = ("fc_err", "fc_rand", "fc_gather")


@dataclass(kw_only=True)
class RowCache:
    """Values a later reduction loop of a row would recompute, kept instead in local arrays of
    one row (``float fc_row0[16];``): the loop that first computes one stores it, later loops
    read it. A softmax over a gathered, masked score (Swin's windows: rows of 16) otherwise
    redoes the gather, the mask's index arithmetic and the ``exp`` in each of its three loops.
    Only floating-point values are kept: an index read from a loop that its failed bounds scan
    skipped would be garbage, a float is only a wrong number in a call that raises anyway."""

    arrays: list[str] = field(default_factory=list)  # declarations, once per row
    stores: dict[int, list[tuple[CValue, str]]] = field(default_factory=dict)  # stage -> (value, array)
    loads: dict[int, list[tuple[CValue, str]]] = field(default_factory=dict)


def _loop_closure(roots: list) -> dict:
    """The values a reduction loop computes to get ``roots``: those that vary along it (a dict
    for a deterministic order: the generated source, and so its cache key, must not vary)."""
    seen: dict = {}
    pending = [v for v in reversed(roots) if v.in_loop()]
    while pending:
        v = pending.pop()
        if v in seen or not v.in_loop():
            continue
        seen[v] = None
        pending.extend(reversed(v.deps))
    return seen


def _all_deps(value: CValue) -> list[CValue]:
    """Every value ``value`` is computed from, in or out of a loop."""
    seen: dict[int, CValue] = {}
    pending = list(value.deps)
    while pending:
        v = pending.pop()
        if id(v) not in seen:
            seen[id(v)] = v
            pending.extend(v.deps)
    return list(seen.values())


@dataclass(kw_only=True)
class KernelSource(backend.KernelSource):
    """A kernel's C++ function and the arguments it takes, in order (pointers, ``int64_t`` sizes,
    and the run's error slot last when it has ``checks``)."""

    accumulators: list[str]  # accumulator types it uses: they need `omp declare reduction`s


def simd_reductions(types: list[str]) -> str:
    """``#pragma omp declare reduction`` for each accumulator type (once per library)."""
    return "".join(f"#pragma omp declare reduction(fc_merge : {t} : omp_out.merge(omp_in)) "
                   f"initializer(omp_priv = {t}())\n" for t in dict.fromkeys(types))


class CppKernelGen(KernelEmitter):
    """The C++ renderer of one kernel: where values go (outer scope, reduction loops, column
    blocks) and the OpenMP around them."""

    PARALLEL_MIN_WORK = PARALLEL_MIN_WORK
    error = CodegenError

    def __init__(self, kernel: Kernel, buffer_dtype: Callable[[str], str], hint: Callable[[sympy.Expr], int],
                 threads: int, buffer_extent: Callable[[str], tuple[int, int] | None] | None = None,
                 buffer_numel: Callable[[str], sympy.Expr] | None = None):
        super().__init__(kernel)
        self.buffer_extent = buffer_extent or (lambda buf: None)
        self.buffer_numel = buffer_numel
        self.serial = bool(kernel.accumulated_buffers())  # see the module docstring
        self.buffer_dtype = buffer_dtype
        self.hint = hint
        self.threads = threads
        self.accumulators: list[Accumulator] = []
        self.accesses: list[sympy.Expr] = []  # index of every memory load and store
        self.bounds_checks: list[CValue] = []  # the ops.check_bounds values (see _scan_indices)
        self.stored: set[str] = set()  # the buffers the kernel writes
        self._scannable_checks: dict[int, bool] = {}  # by id of the check: see _scannable
        # A pointwise kernel of several loops: values that do not change along the innermost
        # loop (a per-channel scale) are computed once per outer point, before it.
        self.inner_only = not kernel.rsizes and len(kernel.xsizes) > 1 and kernel.kind == "pointwise"
        if self.inner_only:
            self.rnames = {f"x{len(kernel.xsizes) - 1}"}
        self.loop_splits: set[int] = set()  # where the innermost loop is split (note_comparison)

    def note_comparison(self, name: str, a: CValue, b: CValue) -> None:
        """Where ``a <name> b``, a comparison of the innermost loop variable of a pointwise
        kernel (``k*x + c``) with an integer, changes its answer along the loop: the loop splits
        there (see the module docstring)."""
        if not self.inner_only:
            return
        last = len(self.kernel.xsizes) - 1
        extent = self.kernel.xsizes[last]
        sides = [_integer_value(a), _integer_value(b)]
        index = a if sides[0] is None else b
        if sides.count(None) != 1 or index.op[:1] != ("index_expr",) or not extent.is_Integer:
            return
        expr = sympy.expand(index.op[1])
        var = next((s for s in expr.free_symbols if s.name == f"x{last}"), None)
        if var is None or expr.free_symbols != {var}:
            return
        coeff, rest = expr.coeff(var), expr.subs(var, 0)
        if not (coeff.is_Integer and rest.is_Integer) or coeff == 0 or expr != coeff * var + rest:
            return
        bound = next(v for v in sides if v is not None)

        def answer(x: int) -> bool:
            at = int(coeff) * x + int(rest)
            lhs, rhs = (at, bound) if index is a else (bound, at)
            return _COMPARE[name](lhs, rhs)

        crossing = sympy.Rational(bound - int(rest), int(coeff))
        for p in sorted({int(sympy.floor(crossing)), int(sympy.ceiling(crossing)), int(sympy.floor(crossing)) + 1}):
            if 0 < p < int(extent) and answer(p - 1) != answer(p):
                self.loop_splits.add(p)

    def index(self, expr) -> str:
        expr, _ = self.read_index(expr)
        return cpp_code(expr, ranges=self.symbol_range)

    # -- generation
    def generate(self) -> KernelSource:
        k = self.kernel
        xs = [self.index(s) for s in k.xsizes]
        rs = [self.index(s) for s in k.rsizes]
        stages: dict[int, StagePlan] = {}
        for n, kn in enumerate(k.nodes):
            self.roots = []
            first_acc = len(self.accumulators)
            kn.node.body.run(CppOps(self, f"n{n}_", self.index(self.flat_reduction_index(kn))), kn.var_map)
            # a store varies along the loop when its index or its value does: a reduction's
            # prologue stores go in the loop, the stores of its result after it
            reduces = len(self.accumulators) > first_acc
            stages.setdefault(kn.stage, StagePlan()).add(self.roots, after=reduces)
        plans = [stages[stage] for stage in sorted(stages)]
        xnumel, rnumel = self.hint(k.numel), self.hint(k.rnumel)
        split = bool(k.rsizes) and rnumel >= SPLIT_REDUCTION_MIN and xnumel < self.threads
        if not split and column_loops.reads_columns(self):
            return column_loops.column_function(self, xs, rs, plans)
        if self.inner_only:
            # no reduction loop: the "loop" scope is the body of the innermost loop
            outer = Scope()
            loop = Scope(parent=outer)
            last = len(xs) - 1
            columns = self._hoist_column_values(plans, last, k.xsizes)
            gathers = self._gather_strided_loads(plans, outer, f"x{last}", k.xsizes[last])
            for plan in plans:
                outer.place_all(plan.before + plan.after)
                self._unchecked(True)
                loop.place_all(plan.in_loop)
                self._unchecked(False)
            guard = self._scan_indices(loop, outer, [f"for (int64_t x{last} = 0; x{last} < {xs[last]}; x{last}++) {{"],
                                       ["}"], [(f"x{last}", xs[last])])
            return self._function(xs, rs, outer.lines + gathers, split, loop.lines, guard, columns)
        for a in self.accumulators:
            if not split and (a.kind == "welford" or a.plain_sum):
                a.add_stmt.code = f"{a.name}_sum += ({a.ctype})({a.value.name});"
        outer = Scope()
        if not split and len(rs) == 1:
            outer.lines.extend(self._gather_strided_loads(plans, outer, "r0", k.rsizes[0]))
        rows = self._row_cache(plans, rs, split)
        outer.lines.extend(rows.arrays)
        for stage, plan in enumerate(plans):
            self._emit_stage(plan, rs, split, outer, rows.loads.get(stage, []), rows.stores.get(stage, []))
        return self._function(xs, rs, outer.lines, split)

    def _gather_strided_loads(self, plans: list[StagePlan], outer: Scope, var: str, extent: sympy.Expr) -> list[str]:
        """Lines, placed before the loops over ``var`` (the innermost loop of a pointwise
        kernel, the one reduction loop of a row), that gather each strided load of a float
        buffer in them into a local array by a plain loop over the row; the vectorised loops
        then read the array in order (see the module docstring). A load under a mask is
        gathered under it (the mask is computed in the gathering loop too). Not gathered: loads
        from a buffer the kernel writes (the loop would read what it stores before it has
        stored it), loads whose index or mask reads memory, checks bounds or takes a
        reduction's result, rows of symbolic or more than :data:`GATHER_ROW_MAX` points, loads
        past :data:`GATHER_BYTES_MAX` of arrays."""
        if not extent.is_Integer or int(extent) > GATHER_ROW_MAX:
            return []
        lines: list[str] = []
        budget = GATHER_BYTES_MAX
        for value in _loop_closure([v for plan in plans for v in plan.in_loop]):
            if value.load_index is None or value.loaded in self.stored or value.ctype not in _CACHED_TYPES:
                continue
            index = sympy.sympify(value.load_index)
            if any(s.name[:1] not in "xr" or not s.name[1:].isdigit() for s in index.free_symbols):
                continue  # (an indirect index or a size symbol)
            step = access.index_step(index, sympy.Symbol(var), self.hint)
            if step in (0, 1, -1):  # (GCC vectorises a read at consecutive places, either way)
                continue
            if any(d.loaded is not None or d.bounds is not None or d.acc is not None for d in _all_deps(value)):
                continue
            budget -= int(extent) * (8 if value.ctype == "double" else 4)
            if budget < 0:
                break
            array = self.fresh("fc_gather")
            gather = Scope(parent=outer)
            gather.place(value)
            lines += [f"{value.ctype} {array}[{int(extent)}];",
                      f"for (int64_t {var} = 0; {var} < {int(extent)}; {var}++) {{"]
            lines += indent(gather.lines + [f"{array}[{var}] = {value.name};"]) + ["}"]
            value.code = f"{value.ctype} {value.name} = {array}[{var}];"
            value.deps = []
        return lines

    def _hoist_column_values(self, plans: list[StagePlan], last: int, xsizes: list[sympy.Expr]) -> list[str]:
        """Lines, placed before the loops of a pointwise kernel, that compute once per call each
        value the innermost loop (over ``x{last}``) needs which depends on that loop's variable
        alone and costs more than a load (a division, a square root, a call), into a local array
        of the loop's length; the innermost loop then reads the array (see the module docstring).
        Values that read a buffer the kernel writes, check an index or draw random numbers stay
        where they are; so does everything when a size is symbolic or a loop is empty."""
        if not all(n.is_Integer and int(n) > 0 for n in xsizes) or int(xsizes[last]) > GATHER_ROW_MAX:
            return []
        var, extent = f"x{last}", int(xsizes[last])
        other_var = re.compile(rf"\b(?!{var}\b)[xr]\d+\b")
        closure = _loop_closure([v for plan in plans for v in plan.in_loop])
        own: dict[CValue, bool] = {}

        def column_only(v: CValue) -> bool:
            if v not in own:
                own[v] = False  # (while its dependencies are looked at)
                own[v] = (v.bounds is None and v.acc is None and v.loaded not in self.stored
                          and not other_var.search(v.code) and not any(w in v.code for w in _KEPT_IN_LOOP)
                          and all(column_only(d) for d in v.deps))
            return own[v]

        frontier: dict[CValue, None] = {}
        for user in closure:
            if not column_only(user):
                frontier.update((d, None) for d in user.deps if d in closure and column_only(d))
        lines: list[str] = []
        budget = COLUMN_VALUES_BYTES
        for v in frontier:
            cone = [v, *_all_deps(v)]
            if v.ctype not in _COLUMN_TYPES or not any("/" in d.code or "fc_" in d.code for d in cone):
                continue
            budget -= extent * (8 if v.ctype in ("double", "int64_t") else 4)
            if budget < 0:
                break
            array = self.fresh("fc_column")
            scope = Scope()
            scope.place(v)
            lines += [f"{v.ctype} {array}[{extent}];", "#pragma omp simd",
                      f"for (int64_t {var} = 0; {var} < {extent}; {var}++) {{"]
            lines += indent(scope.lines + [f"{array}[{var}] = {v.name};"]) + ["}"]
            v.code, v.deps, v.varying, v.exact = f"{v.ctype} {v.name} = {array}[{var}];", [], True, None
            v.load_index = None
        return lines

    def _row_cache(self, plans: list[StagePlan], rs: list[str], split: bool) -> RowCache:
        """Which values of the row's loops later loops read from a local array (see RowCache):
        for each loop, the values of earlier loops it uses directly, the frontier of what it
        would otherwise recompute."""
        rows = RowCache()
        rnumel = sympy.sympify(self.kernel.rnumel)
        if split or len(rs) != 1 or len(plans) < 2 or not rnumel.is_Integer or int(rnumel) > ROW_CACHE_MAX:
            return rows
        earlier: dict = {}  # value -> the stage whose loop first computes it
        arrays: dict = {}  # value -> its array
        for stage, plan in enumerate(plans):
            computed = _loop_closure(plan.in_loop)
            loaded: set = set()
            for user in computed:
                if user in earlier:
                    continue
                for v in user.deps:
                    if v not in earlier or not isinstance(v, CValue) or v in loaded:
                        continue
                    if v.ctype not in _CACHED_TYPES or v.loaded is not None or not v.name:
                        continue  # (a plain load costs what reading the array would)
                    if v not in arrays:
                        arrays[v] = f"fc_row{len(arrays)}"
                        rows.arrays.append(f"{v.ctype} {arrays[v]}[{int(rnumel)}];")
                        rows.stores.setdefault(earlier[v], []).append((v, arrays[v]))
                    loaded.add(v)
                    rows.loads.setdefault(stage, []).append((v, arrays[v]))
            for v in computed:
                earlier.setdefault(v, stage)
        return rows

    def _emit_stage(self, plan: StagePlan, rs, split, outer: Scope, loads: list[tuple[CValue, str]] = (),
                    stores: list[tuple[CValue, str]] = ()) -> None:
        k = self.kernel
        lines = outer.lines
        outer.place_all(plan.before)
        loop = Scope(parent=outer)
        for v, array in loads:  # computed by an earlier loop of this row (see RowCache)
            loop.lines.append(f"const {v.ctype} {v.name} = {array}[r0];")
            loop.seen.add(v)
        # (a split loop runs over threads: its checks stay one per index, as do those of a
        # kernel without a reduction loop, whose innermost loop generate() scans instead)
        self._unchecked(bool(rs) and not split)
        loop.place_all(plan.in_loop)
        for v, array in stores:
            loop.place(v)
            loop.lines.append(f"{array}[r0] = {v.name};")
        self._unchecked(False)
        accs = [a for a in self.accumulators if a.add_stmt in loop.seen]
        lines.extend(f"{a.decl_type} {a.name};" for a in accs)
        if loop.lines:
            head = [f"for (int64_t r{d} = 0; r{d} < {rs[d]}; r{d}++) {{" for d in range(len(k.rsizes))]
            tail = ["}"] * len(head)
            if split and accs:
                numel = " * ".join(f"({r})" for r in rs)
                lines.append("{")
                lines.append("  const int fc_nt = omp_get_max_threads();")
                lines.extend(f"  {a.decl_type}* {a.name}_parts = new {a.decl_type}[fc_nt];" for a in accs)
                lines.append(f"  #pragma omp parallel num_threads(fc_nt) if({numel} >= {SPLIT_REDUCTION_MIN})")
                lines.append("  {")
                lines.extend(f"    {a.decl_type} {a.name};" for a in accs)
                lines.append(f"    #pragma omp for schedule(static) collapse({len(head)})")
                lines.extend(indent(indent(head + indent(loop.lines) + tail)))
                lines.extend(f"    {a.name}_parts[omp_get_thread_num()] = {a.name};" for a in accs)
                lines.append("  }")
                lines.append("  for (int fc_t = 0; fc_t < fc_nt; fc_t++) {")
                lines.extend(f"    {a.name}.merge({a.name}_parts[fc_t]);" for a in accs)
                lines.append("  }")
                lines.extend(f"  delete[] {a.name}_parts;" for a in accs)
                lines.append("}")
            else:
                # Accumulators merge like OpenMP reductions, so the loop vectorises: each lane
                # keeps its own partial (order-independent merges; argmax compares indices).
                welford = [a for a in accs if a.kind == "welford"]
                sums = [a for a in accs if a.plain_sum]
                merged = [a.name for a in accs if a not in welford + sums]
                clauses = [f"fc_merge: {', '.join(merged)}"] if merged else []
                clauses += [f"+: {a.name}_sum" for a in welford + sums]
                lines.extend(f"{a.ctype} {a.name}_sum = 0;" for a in welford + sums)
                reduce = f" reduction({') reduction('.join(clauses)})" if clauses else ""
                variables = [(f"r{d}", rs[d]) for d in range(len(head))]
                guard = self._scan_indices(loop, outer, head, tail, variables) if head else ""
                run = [f"#pragma omp simd collapse({len(head)}){reduce}"] if head else []
                run += head + indent(loop.lines) + tail
                lines.extend([f"if ({guard}) {{"] + indent(run) + ["}"] if guard else run)
                lines.extend(f"{a.name}.v = {a.name}_sum;" for a in sums)
                if welford:
                    self._welford_second_pass(welford, head, tail, rs, outer)
        outer.place_all(plan.after)

    def _unchecked(self, on: bool) -> None:
        """Declare the bounds checks that vary along a loop unchecked (``on``: a scan before
        the loop checks them, see :meth:`_scan_indices`) or checked one by one."""
        for c in self.bounds_checks:
            if c.in_loop():
                c.code = c.bounds.unchecked_code if on and self._scannable(c) else c.bounds.checked_code

    def _scannable(self, check: CValue) -> bool:
        """Whether a scan before the loop can compute the index ``check`` checks: not when the
        index is made of a buffer this kernel writes (a loss's targets, shifted and stored in the
        loop that gathers with them): before the loop has run, the scan would read old bytes."""
        known = self._scannable_checks.get(id(check))
        if known is None:
            known = self._scannable_checks[id(check)] = self._made_before_loop(check)
        return known

    def _made_before_loop(self, check: CValue) -> bool:
        bounds = check.bounds
        assert bounds is not None
        pending = [bounds.value] + ([bounds.live] if bounds.live is not None else [])
        seen: set[int] = set()
        while pending:
            v = pending.pop()
            if id(v) in seen:
                continue
            seen.add(id(v))
            if isinstance(v, CValue) and v.loaded in self.stored:
                return False
            pending.extend(v.deps)
        return True

    def _scan_indices(self, loop: Scope, outer: Scope, head: list[str], tail: list[str],
                      variables: list[tuple[str, Any]]) -> str:
        """Check the indices the unchecked bounds checks of ``loop`` see before it runs: a loop
        of the same ``head`` (over ``variables``: names and extents) computing only them, with
        their least and greatest as OpenMP min/max reductions (it vectorises; a check per index
        inside the loop is a branch and a call, and keeps the loop scalar). Indices that are one
        contiguous run of an int64 buffer are checked in place by ``fc_indices_ok`` instead
        (cheaper: see the prelude). Its lines go to ``outer``; returns the condition the loop
        then runs under ("" when there is nothing to check). A failure is recorded as the check
        would record it, and the loop does not run: its indices are not safe to load at."""
        # (placed unchecked: see _unchecked)
        found = [c for c in self.bounds_checks if c in loop.seen and self._scannable(c)]
        if not found:
            return ""
        scan = Scope(parent=outer)
        lows, highs, oks = [], [], []
        for c in found:
            b = c.bounds
            run = self._contiguous_run(b, variables)
            if run is not None:
                oks.append(f"fc_indices_ok({run[0]}, {run[1]}, {b.size}, {b.site}, fc_err)")
                continue
            low, high = self.fresh("fc_low"), self.fresh("fc_high")
            scan.place(b.scan(low, high))  # (what does not change along the loop goes to outer)
            lows.append(low)
            highs.append(high)
            oks.append(f"fc_bounds_ok({low}, {high}, {b.low}, {b.size}, {b.site}, fc_err)")
        ok = self.fresh("fc_ok")
        if lows:
            outer.lines.extend(f"int64_t {low} = INT64_MAX, {high} = INT64_MIN;" for low, high in zip(lows, highs))
            outer.lines.append(f"#pragma omp simd collapse({len(head)}) reduction(min: {', '.join(lows)}) "
                               f"reduction(max: {', '.join(highs)})")
            outer.lines.extend(head + indent(scan.lines) + tail)
        outer.lines.append(f"const bool {ok} = {' && '.join(oks)};")
        return ok

    def _contiguous_run(self, b: BoundsCheck, variables: list[tuple[str, Any]]) -> tuple[str, str] | None:
        """(the C++ address of the first, their count) where the indices ``b`` checks are read
        unmasked from an int64 buffer at consecutive places along the loop's one variable, and
        checked in [0, size); else None."""
        if b.read is None or len(variables) != 1:
            return None
        buf, index = b.read
        index = sympy.expand(sympy.sympify(index))
        by_name = {s.name: s for s in index.free_symbols}
        var = by_name.get(variables[0][0])
        if var is None or any(name in self.indirect or name in self.rnames - {var.name} for name in by_name):
            return None
        start = index.subs(var, 0)
        if sympy.expand(index - start - var) != 0:
            return None
        return f"{buf} + ({self.index(start)})", str(variables[0][1])

    def _welford_second_pass(self, accs: list[Accumulator], head, tail, rs, outer: Scope) -> None:
        """Mean from the first loop's sums, then a second loop summing squared deviations: two
        plain sums vectorise where Welford's per-element division does not, and are as exact."""
        lines = outer.lines
        count = " * ".join(f"({r})" for r in rs) or "1"
        loop = Scope(parent=outer)
        for a in accs:
            t, value = a.ctype, a.value
            lines.append(f"const {t} {a.name}_n = ({t})({count});")
            lines.append(f"const {t} {a.name}_mean = {a.name}_n > 0 ? {a.name}_sum / {a.name}_n : {t}(0);")
            lines.append(f"{t} {a.name}_m2 = 0;")
            dev = CValue(name=f"{a.name}_dev", code=f"{t} {a.name}_dev = ({t})({value.name}) - {a.name}_mean; "
                         f"{a.name}_m2 += {a.name}_dev * {a.name}_dev;", deps=[value], varying=True)
            loop.place(dev)
        reduce = " ".join(f"reduction(+: {a.name}_m2)" for a in accs)
        if head:
            lines.append(f"#pragma omp simd collapse({len(head)}) {reduce}")
        # (a block even without reduction loops: its names repeat the first pass's)
        lines.extend((head or ["{"]) + indent(loop.lines) + (tail or ["}"]))
        lines.extend(f"{a.name}.mean = {a.name}_mean; {a.name}.m2 = {a.name}_m2; {a.name}.n = {a.name}_n;"
                     for a in accs)

    def parallel(self, pragma: str, collapse: int) -> list[str]:
        """``pragma`` over the outer loops where the kernel's work pays for the threads' fork
        (a test at run time when the work is symbolic)."""
        work = self.kernel.numel * self.kernel.rnumel
        if work.is_Integer:
            return [f"{pragma} collapse({collapse})"] if int(work) >= PARALLEL_MIN_WORK else []
        return [f"{pragma} collapse({collapse}) if({self.index(work)} >= {PARALLEL_MIN_WORK})"]

    def source(self, body: list[str]) -> KernelSource:
        """The function around ``body``: one pointer per buffer, then the size symbols."""
        k = self.kernel
        buffers = sorted(self.buffers)
        symbols = sorted(self.symbols)
        params = []
        for b in buffers:
            const = "" if self.buffers[b] else "const "
            params.append(f"{const}{ctype(self.buffer_dtype(b), storage=True)}* __restrict__ {b}")
        params += [f"const int64_t {s}" for s in symbols]
        params += ["int64_t* fc_err"] if self.checks else []
        out = [f'extern "C" void {k.name}({", ".join(params)}) {{'] + indent(body) + ["}"]
        return KernelSource(name=k.name, source="\n".join(out) + "\n", buffers=buffers, symbols=symbols,
                            accumulators=sorted({a.decl_type for a in self.accumulators}), checks=list(self.checks))

    def _function(self, xs, rs, lines, split, inner: list[str] | None = None, guard: str = "",
                  before: list[str] = ()) -> KernelSource:
        k = self.kernel
        body: list[str] = list(before)
        nx = len(xs)
        if nx:
            heads = [f"for (int64_t x{d} = 0; x{d} < {xs[d]}; x{d}++) {{" for d in range(nx)]
            pointwise = not k.rsizes
            # Every point of a pointwise kernel is independent: `omp simd` on the innermost loop
            # says so (the __restrict__ of the parameters does not reach OpenMP's outlined body).
            simd = pointwise and nx == 1
            parallel = "#pragma omp parallel for simd" if simd else "#pragma omp parallel for"
            parallel_lines = [] if split else self.parallel(parallel, max(1, nx - 1) if pointwise else nx)
            body += parallel_lines or (["#pragma omp simd"] if simd else [])
            if inner is not None:  # hoisted values, then the innermost loop (if its indices are in range)
                run = []
                for lo, hi in self._inner_ranges(xs[-1]):
                    head = heads[-1] if lo is None else f"for (int64_t x{nx - 1} = {lo}; x{nx - 1} < {hi}; x{nx - 1}++) {{"
                    run += ["#pragma omp simd", head] + indent(inner) + ["}"]
                body += heads[:-1] + indent(lines + ([f"if ({guard}) {{"] + indent(run) + ["}"] if guard else run))
                body += ["}"] * (nx - 1)
            else:
                if pointwise and nx > 1:
                    heads.insert(nx - 1, "#pragma omp simd")
                body += heads + indent(lines) + ["}"] * nx
        else:
            body += lines
        if self.serial:
            body = self._cleared() + [line for line in body if not line.lstrip().startswith("#pragma omp")]
        return self.source(body)

    def _inner_ranges(self, extent: str) -> list[tuple[int | None, int | None]]:
        """The ranges the innermost loop of a pointwise kernel runs as: split where a mask
        changes along it (see :meth:`note_comparison`), else once whole (``(None, None)``)."""
        if not self.loop_splits or len(self.loop_splits) > MAX_LOOP_SPLITS:
            return [(None, None)]
        ends = [0, *sorted(self.loop_splits), int(extent)]
        return list(zip(ends[:-1], ends[1:]))

    def _cleared(self) -> list[str]:
        """Lines zeroing the buffers the kernel adds into (all of each buffer's memory)."""
        if self.buffer_numel is None:
            raise CodegenError(f"kernel {self.kernel.name} adds into buffers: generate_kernel needs buffer_numel")
        lines = []
        for buf in self.kernel.accumulated_buffers():
            n = self.index(self.buffer_numel(buf))
            zero = f"({ctype(self.buffer_dtype(buf), storage=True)})(0)"
            lines.append(f"for (int64_t fc_i = 0; fc_i < {n}; fc_i++) {buf}[fc_i] = {zero};")
        return lines


def _integer_value(v: CValue) -> int | None:
    """The integer ``v`` always is (an integer constant, an index that is a number), or None."""
    if v.op[:1] == ("constant",):
        return int(v.op[1])
    if v.op[:1] == ("index_expr",) and v.op[1].is_Integer:
        return int(v.op[1])
    return None


def generate_kernel(kernel: Kernel, buffer_dtype: Callable[[str], str], hint: Callable[[sympy.Expr], int],
                    threads: int | None = None,
                    buffer_extent: Callable[[str], tuple[int, int] | None] | None = None,
                    buffer_numel: Callable[[str], sympy.Expr] | None = None) -> KernelSource:
    """C++ for one kernel; ``hint`` evaluates a size expression at its hint (for choosing how to
    parallelise), ``threads`` is the number of threads planned for, ``buffer_extent`` gives the
    least and greatest index of a buffer's elements where known (loads under a mask that does
    not change along a loop use it), ``buffer_numel`` the elements of a buffer's memory (a kernel
    that adds into a buffer clears it first). The kernel's internal buffers are never stored; one
    a later loop over ``r`` reads (fireclay-loops decides which) is recomputed by that loop."""
    return CppKernelGen(kernel, buffer_dtype, hint, threads or os.cpu_count() or 1, buffer_extent,
                        buffer_numel).generate()
