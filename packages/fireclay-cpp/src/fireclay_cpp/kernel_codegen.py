"""One scheduled kernel as one ``extern "C"`` C++ function.

Each node body is replayed (``LoopBody.run``) on :class:`_CValues`, a handler that turns every
``ops.*`` call into a :class:`_Val`: a C++ expression with its dependencies. Placement comes
after: a value is declared, on demand, in the scope that first needs it:

* the *outer* scope runs once per point of the outer (``x``) loops: pointwise nodes that do not
  touch a reduction variable, and everything after a reduction loop (its epilogue);
* the *loop* scope is the body of a reduction loop (``r``): what feeds an accumulator, and
  pointwise nodes indexed by ``r``.

A kernel's nodes run in stages (``KernelNode.stage``): one reduction loop per stage, so a node
reading a reduction result of its own kernel runs in a later loop over ``r``. A value that does
not change along ``r`` is hoisted out of the loop; a value placed in a loop is recomputed in each
later loop that reads it (which is how internal buffers read by later loops never reach memory).

Vectorisation: each reduction loop is ``omp simd`` with its accumulators as OpenMP reductions.
Welford's update divides per element and does not vectorise, so outside split reductions it
becomes two passes over the row: a sum for the mean, then a sum of squared deviations.

Column reductions (a reduction whose memory is contiguous along the innermost kept dim and
strided along the reduced one: a bias gradient, the column sums of a ``[rows, cols]`` tensor) run
the other way round: the kept dim goes in blocks, one accumulator per point of the block, the
reduction loop outside and an ``omp simd`` loop over the block inside, so every load reads
consecutive addresses instead of gathering one per lane. A block is as wide as the kept dim (up
to :data:`COLUMN_BLOCK` points and :data:`COLUMN_BLOCK_BYTES` of accumulators): the reduction
loop then walks whole rows, in memory order; blocks of part of a row make each pass over the
rows skip through memory, which measured up to twice as slow once the rows leave the cache
(a layer-norm weight gradient over 4096 x 768). When there are fewer blocks than threads at
run time, the blocks are narrowed then, so that every thread has one. A kernel's
later loops over ``r`` (batch norm's backward over channels-last memory: the input gradient
needs the per-channel sums of the first loop) run the same way, block by block.

Parallelism: the outer loops are an OpenMP ``parallel for`` (all but the innermost for pointwise
kernels, so the innermost stays a plain loop the compiler vectorises). When there are few outer
points and a long reduction, the reduction loop itself is split over threads instead, with
per-thread accumulators merged in thread order (deterministic for a given thread count).
"""

from __future__ import annotations

import math
import os
import struct
from collections.abc import Callable
from dataclasses import dataclass, field

import sympy

from fireclay_cpp.errors import CodegenError
from fireclay_cpp.prelude import CTYPES
from fireclay_loops import Kernel
from fireclay_loops.codegen_support import KernelGenState
from fireclay_shapes import cpp_code

PARALLEL_MIN_WORK = 16384  # points of work below which the OpenMP fork costs more than it saves
SPLIT_REDUCTION_MIN = 4096  # reduction length from which a lone reduction is split over threads
COLUMN_BLOCK = 4096  # most kept-dim points per block of a column reduction (accumulators live in arrays)
COLUMN_BLOCK_BYTES = 32 * 1024  # most bytes of a column block's accumulator arrays (on the stack)
COLUMN_MIN_BLOCK = 16  # narrowest block when blocks are narrowed for threads (two AVX2 float vectors)


def ctype(dtype: str) -> str:
    """The C++ type values of ``dtype`` are computed in."""
    if dtype not in CTYPES:
        raise CodegenError(f"the C++ backend has no support for dtype {dtype}")
    return CTYPES[dtype][1]


def storage_type(dtype: str) -> str:
    if dtype not in CTYPES:
        raise CodegenError(f"the C++ backend has no support for dtype {dtype}")
    return CTYPES[dtype][0]


@dataclass(eq=False)
class _Val:
    """A C++ value: ``decl`` is the statement that defines ``name`` (or performs a side effect)."""

    name: str
    decl: str
    deps: list[_Val] = field(default_factory=list)
    ctype: str = ""
    acc: _Acc | None = None  # set on reduction values: they live in an accumulator
    varying: bool | None = None  # changes along the reduction loop (None: if a dependency does)

    def in_loop(self) -> bool:
        """Whether it must be computed inside the reduction loop; the rest is hoisted out."""
        if self.varying is None:
            self.varying = any(d.in_loop() for d in self.deps)
        return self.varying


@dataclass(eq=False)
class _Acc:
    name: str
    decl_type: str
    add_stmt: _Val | None = None
    welford: tuple[str, _Val] | None = None  # (compute type, value added): computed in two passes
    plain_sum: tuple[str, _Val] | None = None  # a float sum: a plain variable with OpenMP's `+`


_UNARY_CALL = {
    "exp": "fc_exp", "exp2": "fc_exp2", "expm1": "fc_expm1", "log": "fc_log", "log2": "fc_log2",
    "log10": "fc_log10", "log1p": "fc_log1p", "sqrt": "fc_sqrt", "sin": "fc_sin", "cos": "fc_cos",
    "tan": "fc_tan", "asin": "fc_asin", "acos": "fc_acos", "atan": "fc_atan", "sinh": "fc_sinh",
    "cosh": "fc_cosh", "tanh": "fc_tanh", "asinh": "fc_asinh", "acosh": "fc_acosh",
    "atanh": "fc_atanh", "erf": "fc_erf", "erfc": "fc_erfc", "floor": "fc_floor", "ceil": "fc_ceil",
    "round": "fc_nearbyint", "trunc": "fc_trunc", "lgamma": "fc_lgamma",
}
_UNARY_TEMPLATE = {
    "neg": "-({a})", "rsqrt": "{T}(1) / fc_sqrt({a})", "reciprocal": "{T}(1) / ({a})",
    "square": "({a}) * ({a})", "frac": "({a}) - fc_trunc({a})", "sigmoid": "fc_sigmoid<{T}>({a})",
    "relu": "fc_relu<{T}>({a})", "sign": "fc_sign<{T}>({a})", "abs": "fc_abs<{T}>({a})",
    "logical_not": "!({a})", "isnan": "fc_isnan({a})", "isinf": "fc_isinf({a})",
}
_BINARY_TEMPLATE = {
    "add": "{a} + {b}", "sub": "{a} - {b}", "mul": "{a} * {b}", "truediv": "{a} / {b}",
    "floordiv": "fc_floordiv_v<{T}>({a}, {b})", "remainder": "fc_remainder<{T}>({a}, {b})",
    "fmod": "fc_fmod<{T}>({a}, {b})", "pow": "fc_pow<{T}>({a}, {b})", "maximum": "fc_maximum<{T}>({a}, {b})",
    "minimum": "fc_minimum<{T}>({a}, {b})", "atan2": "fc_atan2(({T})({a}), ({T})({b}))",
    "copysign": "fc_copysign(({T})({a}), ({T})({b}))",
    "eq": "{a} == {b}", "ne": "{a} != {b}", "lt": "{a} < {b}", "le": "{a} <= {b}", "gt": "{a} > {b}",
    "ge": "{a} >= {b}", "logical_and": "({a} != 0) && ({b} != 0)", "logical_or": "({a} != 0) || ({b} != 0)",
    "logical_xor": "({a} != 0) != ({b} != 0)", "bitwise_and": "{a} & {b}", "bitwise_or": "{a} | {b}",
    "bitwise_xor": "{a} ^ {b}",
}


def _float_literal(v: float) -> str:
    if math.isnan(v):
        return "FC_NAN"
    if math.isinf(v):
        return ("-" if v < 0 else "") + "FC_INF"
    return repr(float(v))


def _as_float32(v: float) -> float:
    """``v`` rounded to the nearest float32 (as a C++ cast to float rounds it); a finite value
    beyond float32's range is left to the cast."""
    try:
        rounded = struct.unpack("f", struct.pack("f", v))[0]
    except OverflowError:
        return v
    return v if math.isinf(rounded) and not math.isinf(v) else rounded


def _int_literal(v: int) -> str:
    if v == -(2**63):
        return "(-9223372036854775807LL - 1)"
    return f"{v}LL" if abs(v) >= 2**31 else str(v)


class _CValues:
    """The ``ops`` handler: builds :class:`_Val` graphs for one node body."""

    def __init__(self, gen: _KernelGen, prefix: str, ridx: str):
        self.gen = gen
        self.prefix = prefix
        self.ridx = ridx  # the flat reduction index of this node (argmax/argmin positions)
        self.count = 0

    def _val(self, expr: str, ctype_: str, deps: list[_Val], varying: bool | None = None,
             loads: str | None = None) -> _Val:
        """The value of ``expr``; one the kernel already computed from the same dependencies is
        reused (the nodes of a fused kernel repeat loads and math: a GELU and its gradient both
        take erf of the same input). ``loads``: the buffer ``expr`` reads, whose reads a store
        to it makes stale."""
        key = (loads, expr, ctype_, tuple(id(d) for d in deps))
        found = self.gen.values.get(key)
        if found is not None:
            return found
        name = f"{self.prefix}t{self.count}"
        self.count += 1
        val = self.gen.values[key] = _Val(name, f"{ctype_} {name} = {expr};", deps, ctype_, varying=varying)
        return val

    def _index(self, index) -> tuple[str, list[_Val]]:
        return self.gen.index(index), self.gen.indirect_deps(index)

    def _varies(self, index) -> bool | None:
        """True when ``index`` names a reduction variable; else the dependencies decide."""
        names = {s.name for s in sympy.sympify(index).free_symbols}
        return True if names & self.gen.rnames else None

    # memory
    def load(self, buf, index):
        if buf in self.gen.local:
            return self.gen.internal_store(buf)
        text, deps = self._index(index)
        dtype = self.gen.buffer_dtype(buf)
        self.gen.use_buffer(buf, write=False)
        self.gen.accesses.append(index)
        return self._val(_widen(dtype, f"{buf}[{text}]"), ctype(dtype), deps, self._varies(index), loads=buf)

    def masked_load(self, buf, index, mask):
        if buf in self.gen.local:
            # (the stored value by its own name: a float32 store keeps the value itself, no copy)
            store = self.gen.internal_store(buf)
            return self._val(f"{mask.name} ? {store.name} : {store.ctype}(0)", store.ctype, [store, mask])
        text, deps = self._index(index)
        dtype = self.gen.buffer_dtype(buf)
        self.gen.use_buffer(buf, write=False)
        self.gen.accesses.append(index)
        t = ctype(dtype)
        return self._val(f"{mask.name} ? ({t})({_widen(dtype, f'{buf}[{text}]')}) : {t}(0)", t, deps + [mask],
                         self._varies(index), loads=buf)

    def store(self, buf, index, value):
        dtype = self.gen.buffer_dtype(buf)
        if buf in self.gen.local:
            t = ctype(dtype)
            if dtype not in ("float16", "bfloat16") and value.ctype == t:
                # The value itself: a read of it is the value (and math on it is shared).
                self.gen.internal_stores[buf] = value
                return None
            # Round as a trip through memory would, so fused half-precision code matches eager.
            v = _round_half(dtype, f"({t})({value.name})")
            val = _Val(f"int_{buf}", f"{t} int_{buf} = {v};", [value], t)
            self.gen.internal_stores[buf] = val
            self.gen.roots.append(val)
            return None
        text, deps = self._index(index)
        self.gen.use_buffer(buf, write=True)
        self.gen.accesses.append(index)
        self.gen.values = {k: v for k, v in self.gen.values.items() if k[0] != buf}  # its reads are stale
        stmt = _Val(f"{self.prefix}st{self.count}", f"{buf}[{text}] = {_narrow(dtype, value.name)};",
                    deps + [value], varying=True)
        self.count += 1
        self.gen.roots.append(stmt)
        return None

    store_reduction = store

    # values
    def constant(self, value, dtype):
        t = ctype(dtype)
        if dtype == "bool":
            return self._val("true" if value else "false", t, [])
        if dtype.startswith(("float", "bfloat")):
            # (the literal rounded as the cast rounds it: equal constants then read equal)
            value = _as_float32(float(value)) if t == "float" else float(value)
            return self._val(f"({t})({_float_literal(value)})", t, [])
        return self._val(f"({t})({_int_literal(int(value))})", t, [])

    def index_expr(self, expr, dtype):
        text, deps = self._index(expr)
        t = ctype(dtype)
        return self._val(f"({t})({text})", t, deps, self._varies(expr))

    def to_dtype(self, x, dtype):
        t = ctype(dtype)
        return self._val(_round_half(dtype, f"({t})({x.name})"), t, [x])

    def random(self, kind, seed, offset):
        text, deps = self._index(offset)
        fn = "fc_rand" if kind == "rand" else "fc_randn"
        return self._val(f"{fn}((uint64_t){int(seed)}ULL, {text})", "float", deps, self._varies(offset))

    def indirect_indexing(self, value, size, name):
        val = _Val(name, f"int64_t {name} = (int64_t)({value.name});", [value], "int64_t")
        self.gen.indirect[name] = val
        return None

    # checks: a failure is recorded in the run's error slot `fc_err` (see the prelude)
    def check_bounds(self, value, size, negative, site, mask=None):
        n, deps = self._index(size)
        live = [mask] if mask is not None else []
        k = self.gen.add_check("check_bounds", site)
        expr = (f"fc_check_bounds({value.name}, {f'-({n})' if negative else '0'}, {n}, "
                f"{mask.name if live else 'true'}, {k}, fc_err)")
        return self._val(expr, "int64_t", [value] + deps + live)

    def check_nonzero(self, value, site, mask=None):
        live = [mask] if mask is not None else []
        k = self.gen.add_check("check_nonzero", site)
        return self._val(f"fc_check_nonzero<{value.ctype}>({value.name}, {mask.name if live else 'true'}, {k}, fc_err)",
                         value.ctype, [value] + live)

    def reduction(self, dtype, src_dtype, reduction_type, value):
        t = ctype(src_dtype if reduction_type in ("argmax", "argmin", "any", "all") else dtype)
        acc = _Acc(self.gen.fresh("acc"), f"fc_{reduction_type}_acc<{t}>")
        acc.add_stmt = _Val(f"{acc.name}_add", f"{acc.name}.add(({t})({value.name}), {self.ridx});", [value],
                            varying=True)
        self.gen.accumulators.append(acc)
        self.gen.roots.append(acc.add_stmt)
        if reduction_type == "sum" and t in ("float", "double"):
            acc.plain_sum = (t, value)
        if reduction_type == "welford":
            acc.welford = (t, value)
            return _Val(acc.name, "", [], t, acc)
        out_t = ctype(dtype)
        val = self._val(f"({out_t})({acc.name}.result())", out_t, [])
        val.acc = acc
        return val

    def getitem(self, value, i):
        if value.acc is None:
            raise CodegenError(f"getitem of a value that is not a multi-part reduction: {value.name}")
        val = self._val(f"{value.acc.name}.get({int(i)})", value.ctype, [])
        val.acc = value.acc  # computed from the accumulator: it belongs after the loop
        return val

    def __getattr__(self, name):
        if name in _UNARY_CALL or name in _UNARY_TEMPLATE or name == "bitwise_not":
            def unary(a):
                t = a.ctype
                if name in ("logical_not", "isnan", "isinf"):
                    t = "bool"
                if name == "bitwise_not":
                    expr = f"!({a.name})" if a.ctype == "bool" else f"~({a.name})"
                elif name in _UNARY_CALL:
                    arg = a.name if a.ctype in ("float", "double") else f"(double)({a.name})"
                    expr = f"{_UNARY_CALL[name]}({arg})"
                else:
                    expr = _UNARY_TEMPLATE[name].format(a=a.name, T=a.ctype)
                return self._val(f"({t})({expr})", t, [a])
            return unary
        if name in _BINARY_TEMPLATE:
            def binary(a, b):
                is_bool = name in ("eq", "ne", "lt", "le", "gt", "ge", "logical_and", "logical_or", "logical_xor")
                t = "bool" if is_bool else a.ctype
                expr = _BINARY_TEMPLATE[name].format(a=a.name, b=b.name, T=t)
                return self._val(f"({t})({expr})", t, [a, b])
            return binary
        if name == "where":
            def where(c, a, b):
                t = a.ctype  # the recorder gives where the dtype of its first value
                return self._val(f"{c.name} ? ({t})({a.name}) : ({t})({b.name})", t, [c, a, b])
            return where
        raise AttributeError(name)


def _widen(dtype: str, text: str) -> str:
    if dtype == "bfloat16":
        return f"fc_bf16_to_float({text})"
    if dtype == "float16":
        return f"(float)({text})"
    return text


def _narrow(dtype: str, text: str) -> str:
    if dtype == "bfloat16":
        return f"fc_float_to_bf16((float)({text}))"
    return f"({storage_type(dtype)})({text})"


def _round_half(dtype: str, text: str) -> str:
    if dtype == "bfloat16":
        return f"fc_round_bf16({text})"
    if dtype == "float16":
        return f"fc_round_f16({text})"
    return text


@dataclass
class KernelSource:
    """A kernel's C++ function and the arguments it takes, in order."""

    name: str
    source: str
    buffers: list[str]  # data pointers, in this order
    symbols: list[str]  # then int64_t sizes, in this order
    accumulators: list[str]  # accumulator types it uses: they need `omp declare reduction`s
    checks: list = field(default_factory=list)  # its CheckSites: it then takes the run's error slot last


def simd_reductions(types: list[str]) -> str:
    """``#pragma omp declare reduction`` for each accumulator type (once per library)."""
    return "".join(f"#pragma omp declare reduction(fc_merge : {t} : omp_out.merge(omp_in)) "
                   f"initializer(omp_priv = {t}())\n" for t in dict.fromkeys(types))


class _KernelGen(KernelGenState):
    def __init__(self, kernel: Kernel, buffer_dtype: Callable[[str], str], hint: Callable[[sympy.Expr], int],
                 threads: int):
        super().__init__(kernel)
        self.local = set(kernel.internal)  # values that never reach memory
        self.buffer_dtype = buffer_dtype
        self.hint = hint
        self.threads = threads
        self.internal_stores: dict[str, _Val] = {}
        self.accumulators: list[_Acc] = []
        self.roots: list[_Val] = []
        self.accesses: list[sympy.Expr] = []  # index of every memory load and store
        self.values: dict[tuple, _Val] = {}  # computed values, for reuse (see _CValues._val)
        # A pointwise kernel of several loops: values that do not change along the innermost
        # loop (a per-channel scale) are computed once per outer point, before it.
        self.inner_only = not kernel.rsizes and len(kernel.xsizes) > 1 and kernel.kind == "pointwise"
        if self.inner_only:
            self.rnames = {f"x{len(kernel.xsizes) - 1}"}

    def internal_store(self, buf: str) -> _Val:
        if buf not in self.internal_stores:
            raise CodegenError(f"{buf} is read in {self.kernel.name} before the kernel computes it")
        return self.internal_stores[buf]

    def index(self, expr) -> str:
        expr = sympy.sympify(expr)
        for s in expr.free_symbols:
            if s.name not in self.sizes and s.name not in self.indirect:
                self.symbols.add(s.name)
        return cpp_code(expr, ranges=self.symbol_range)

    def indirect_deps(self, expr) -> list[_Val]:
        return [self.indirect[s.name] for s in sympy.sympify(expr).free_symbols if s.name in self.indirect]

    def _uses_reduction_vars(self, kn) -> bool:
        for op in kn.node.body.ops:
            for a in op.args:
                if isinstance(a, sympy.Basic) and any(s.name in self.rnames for s in a.xreplace(kn.var_map).free_symbols):
                    return True
        return False

    # -- generation
    def generate(self) -> KernelSource:
        k = self.kernel
        xs = [self.index(s) for s in k.xsizes]
        rs = [self.index(s) for s in k.rsizes]
        stages: dict[int, list[tuple[list[_Val], list[_Val], list[_Val]]]] = {}
        for n, kn in enumerate(k.nodes):
            self.roots = []
            first_acc = len(self.accumulators)
            flat = sympy.Integer(0)
            body = kn.node.body
            for rv, size in zip(body.reduction_vars, body.reduction_sizes):
                flat = flat * size + kn.var_map.get(rv, rv)
            kn.node.body.run(_CValues(self, f"n{n}_", self.index(flat)), kn.var_map)
            adds = [a.add_stmt for a in self.accumulators[first_acc:]]
            uses_r = self._uses_reduction_vars(kn)
            if adds:
                in_loop = adds + [r for r in self.roots if r not in adds and _feeds_only_loop(r)]
                after = [r for r in self.roots if r not in in_loop]
                pre = []
            elif uses_r:
                pre, in_loop, after = [], list(self.roots), []
            else:
                pre, in_loop, after = list(self.roots), [], []
            stages.setdefault(kn.stage, []).append((pre, in_loop, after))
        xnumel, rnumel = self.hint(k.numel), self.hint(k.rnumel)
        split = bool(k.rsizes) and rnumel >= SPLIT_REDUCTION_MIN and xnumel < self.threads
        if not split and self._reads_columns():
            return self._column_function(xs, rs, [stages[stage] for stage in sorted(stages)])
        if not split:
            for a in self.accumulators:
                if a.welford is not None or a.plain_sum is not None:
                    t, value = a.welford or a.plain_sum
                    a.add_stmt.decl = f"{a.name}_sum += ({t})({value.name});"
        outer = _Scope([])
        for stage in sorted(stages):
            self._emit_stage(stages[stage], rs, split, outer)
        if self.inner_only:
            # no reduction loop: the "loop" scope is the body of the innermost loop
            outer = _Scope([])
            loop = _Scope([], outer)
            for stage in sorted(stages):
                for pre, in_loop, after in stages[stage]:
                    for v in pre + after:
                        _place(v, outer)
                    for v in in_loop:
                        _place(v, loop)
            return self._function(xs, rs, outer.lines, split, loop.lines)
        return self._function(xs, rs, outer.lines, split)

    def _emit_stage(self, nodes, rs, split, outer: _Scope) -> None:
        k = self.kernel
        lines = outer.lines
        for pre, _, _ in nodes:
            for v in pre:
                _place(v, outer)
        loop = _Scope([], outer)
        for _, in_loop, _ in nodes:
            for v in in_loop:
                _place(v, loop)
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
                lines.extend(_indent(_indent(head + _indent(loop.lines) + tail)))
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
                welford = [a for a in accs if a.welford is not None]
                sums = [a for a in accs if a.plain_sum is not None]
                merged = [a.name for a in accs if a.welford is None and a.plain_sum is None]
                clauses = [f"fc_merge: {', '.join(merged)}"] if merged else []
                clauses += [f"+: {a.name}_sum" for a in welford + sums]
                lines.extend(f"{(a.welford or a.plain_sum)[0]} {a.name}_sum = 0;" for a in welford + sums)
                reduce = f" reduction({') reduction('.join(clauses)})" if clauses else ""
                if head:
                    lines.append(f"#pragma omp simd collapse({len(head)}){reduce}")
                lines.extend(head + _indent(loop.lines) + tail)
                lines.extend(f"{a.name}.v = {a.name}_sum;" for a in sums)
                if welford:
                    self._welford_second_pass(welford, head, tail, rs, outer)
        for _, _, after in nodes:
            for v in after:
                _place(v, outer)

    def _reads_columns(self) -> bool:
        """Whether this reduction's memory runs along the innermost kept dim rather than the
        innermost reduced one: some access is contiguous in ``x`` (last) and none in ``r`` (last).
        An access that ``x`` does not move (a per-row mean or scale of a layer-norm weight
        gradient) is one value per reduction step for a whole block, so it does not count."""
        k = self.kernel
        if not k.rsizes or not k.xsizes:
            return False
        x, r = k.xvars[-1], k.rvars[-1]
        along_x = along_r = 0
        for index in self.accesses:
            index = sympy.sympify(index)
            if not any(s.name in self.rnames for s in index.free_symbols):
                continue  # read once per kept point, whatever the loop order
            if _step(index, x, self.hint) == 0:
                continue  # read once per reduction step, whatever the loop order
            if _step(index, r, self.hint) == 1:
                along_r += 1
            elif _step(index, x, self.hint) == 1:
                along_x += 1
        return along_x > 0 and along_r == 0

    def _column_function(self, xs, rs, stages) -> KernelSource:
        """The kernel with the innermost kept dim in blocks: for each block, every stage's loop
        over ``r`` runs outside and an ``omp simd`` loop over the block's points inside it (see
        the module docstring), so each load of each loop reads consecutive addresses.
        ``stages``: per stage, the (before, in loop, after) values of its nodes. Around each
        loop, a loop over the block's points computes once per point what comes after a
        reduction (its result, its stores) and what the next loop needs that does not change
        along ``r`` (a per-channel scale of batch norm's backward, a mask of a concatenation),
        into arrays that loop reads. A later loop recomputes what it needs of an earlier one."""
        k = self.kernel
        nx = len(xs)
        last, extent = f"x{nx - 1}", xs[-1]
        width = self._column_block()
        if extent.isdigit():
            width = min(width, int(extent))  # (fewer columns than a block: one block of them all)
        arrays: list[str] = []
        restore: dict[_Acc, str] = {}
        for a in self.accumulators:
            if a.plain_sum is not None:
                t, value = a.plain_sum
                a.add_stmt.decl = f"{a.name}_col[fc_i] += ({t})({value.name});"
                arrays += [f"{t} {a.name}_col[{width}];",
                           f"for (int64_t fc_i = 0; fc_i < {width}; fc_i++) {a.name}_col[fc_i] = 0;"]
                restore[a] = f"{a.decl_type} {a.name}; {a.name}.v = {a.name}_col[fc_i];"
            else:
                # (Welford included: its online update is exact enough, and here it vectorises)
                a.add_stmt.decl = a.add_stmt.decl.replace(f"{a.name}.add(", f"{a.name}_col[fc_i].add(", 1)
                arrays.append(f"{a.decl_type} {a.name}_col[{width}];")
                restore[a] = f"{a.decl_type} {a.name} = {a.name}_col[fc_i];"
        point = [f"const int64_t {last} = fc_xb + fc_i;"]

        def over_block(lines: list[str], simd: bool = False) -> list[str]:
            head = ["#pragma omp simd"] if simd else []
            return head + ["for (int64_t fc_i = 0; fc_i < fc_xn; fc_i++) {"] + _indent(point + lines) + ["}"]

        rheads = [f"for (int64_t r{d} = 0; r{d} < {rs[d]}; r{d}++) {{" for d in range(len(rs))]
        if extent.isdigit() and int(extent) % width == 0:
            block = [f"const int64_t fc_xn = {width};"]  # (a constant trip count: no remainder loop)
        else:
            block = [f"const int64_t fc_xn = ({extent}) - fc_xb < {width} ? ({extent}) - fc_xb : {width};"]
        block += arrays
        kept: dict[_Val, None] = {}  # values some loop reads per point from an array
        done: list[_Acc] = []  # accumulators whose loop has run: each per-point scope restores them
        points = _Scope([])
        for nodes in stages:
            loop, needed = _Scope([]), []
            for before, _, _ in nodes:
                for v in before:
                    _place(v, points)
            for _, in_loop, _ in nodes:
                for v in in_loop:
                    _place_in_column_loop(v, loop, points, needed)
            points.lines += [f"{v.name}_col[fc_i] = {v.name};" for v in needed]
            kept.update(dict.fromkeys(needed))
            if loop.lines:
                if points.lines:
                    block += over_block([restore[a] for a in done] + points.lines)
                block += rheads + _indent(over_block(loop.lines, simd=True)) + ["}"] * len(rheads)
                done += [a for a in self.accumulators if a.add_stmt in loop.seen]
                points = _Scope([])
            for _, _, after in nodes:
                for v in after:
                    _place(v, points)
        if points.lines:
            block += over_block([restore[a] for a in done] + points.lines)
        block[1:1] = [f"{v.ctype} {v.name}_col[{width}];" for v in kept]
        heads = [f"for (int64_t x{d} = 0; x{d} < {xs[d]}; x{d}++) {{" for d in range(nx - 1)]
        heads.append(f"for (int64_t fc_xb = 0; fc_xb < {extent}; fc_xb += {width}) {{")
        body = []
        work = k.numel * k.rnumel
        if work.is_Integer and int(work) >= PARALLEL_MIN_WORK:
            body.append(f"#pragma omp parallel for collapse({nx})")
        elif not work.is_Integer:
            body.append(f"#pragma omp parallel for collapse({nx}) if({self.index(work)} >= {PARALLEL_MIN_WORK})")
        if body and self._few_column_blocks(width):
            body[:0] = self._narrowed_block(xs, width, work)
            heads[-1] = f"for (int64_t fc_xb = 0; fc_xb < {extent}; fc_xb += fc_w) {{"
            block[0] = f"const int64_t fc_xn = ({extent}) - fc_xb < fc_w ? ({extent}) - fc_xb : fc_w;"
        body += heads + _indent(block) + ["}"] * nx
        return self._source(body)

    def _column_block(self) -> int:
        """Points per block (the size of its accumulator arrays): the whole kept dim, at its
        hint, rounded up to :data:`COLUMN_MIN_BLOCK`, within :data:`COLUMN_BLOCK` points and
        :data:`COLUMN_BLOCK_BYTES` of accumulators."""
        per_point = sum(_accumulator_bytes(a) for a in self.accumulators) or 1
        fits = max(COLUMN_MIN_BLOCK, COLUMN_BLOCK_BYTES // per_point // COLUMN_MIN_BLOCK * COLUMN_MIN_BLOCK)
        extent = -(-self.hint(self.kernel.xsizes[-1]) // COLUMN_MIN_BLOCK) * COLUMN_MIN_BLOCK
        return max(COLUMN_MIN_BLOCK, min(COLUMN_BLOCK, fits, extent))

    def _few_column_blocks(self, width: int) -> bool:
        """Whether blocks of ``width`` points may leave threads idle (fewer blocks than the
        threads planned for, at the size hints): then the width is chosen again at run time."""
        k = self.kernel
        outer = self.hint(sympy.Mul(*k.xsizes[:-1]))
        return outer * -(-self.hint(k.xsizes[-1]) // width) < self.threads

    def _narrowed_block(self, xs: list[str], width: int, work: sympy.Expr) -> list[str]:
        """C++ that sets ``fc_w``, the points per block: ``width``, or where that gives fewer
        blocks than OpenMP has threads, each row's share of one thread (down to
        :data:`COLUMN_MIN_BLOCK`). With one thread the blocks stay whole rows."""
        outer = " * ".join(f"({x})" for x in xs[:-1]) or "1"
        extent = xs[-1]
        parallel = "" if work.is_Integer else f" && ({self.index(work)}) >= {PARALLEL_MIN_WORK}"
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

    def _welford_second_pass(self, accs: list[_Acc], head, tail, rs, outer: _Scope) -> None:
        """Mean from the first loop's sums, then a second loop summing squared deviations: two
        plain sums vectorise where Welford's per-element division does not, and are as exact."""
        lines = outer.lines
        count = " * ".join(f"({r})" for r in rs) or "1"
        loop = _Scope([], outer)
        for a in accs:
            t, value = a.welford
            lines.append(f"const {t} {a.name}_n = ({t})({count});")
            lines.append(f"const {t} {a.name}_mean = {a.name}_n > 0 ? {a.name}_sum / {a.name}_n : {t}(0);")
            lines.append(f"{t} {a.name}_m2 = 0;")
            dev = _Val(f"{a.name}_dev", f"{t} {a.name}_dev = ({t})({value.name}) - {a.name}_mean; "
                       f"{a.name}_m2 += {a.name}_dev * {a.name}_dev;", [value], varying=True)
            _place(dev, loop)
        reduce = " ".join(f"reduction(+: {a.name}_m2)" for a in accs)
        if head:
            lines.append(f"#pragma omp simd collapse({len(head)}) {reduce}")
        # (a block even without reduction loops: its names repeat the first pass's)
        lines.extend((head or ["{"]) + _indent(loop.lines) + (tail or ["}"]))
        lines.extend(f"{a.name}.mean = {a.name}_mean; {a.name}.m2 = {a.name}_m2; {a.name}.n = {a.name}_n;"
                     for a in accs)

    def _source(self, body: list[str]) -> KernelSource:
        """The function around ``body``: one pointer per buffer, then the size symbols."""
        k = self.kernel
        buffers = sorted(self.buffers)
        symbols = sorted(self.symbols)
        params = []
        for b in buffers:
            const = "" if self.buffers[b] else "const "
            params.append(f"{const}{storage_type(self.buffer_dtype(b))}* __restrict__ {b}")
        params += [f"const int64_t {s}" for s in symbols]
        params += ["int64_t* fc_err"] if self.checks else []
        out = [f'extern "C" void {k.name}({", ".join(params)}) {{'] + _indent(body) + ["}"]
        return KernelSource(k.name, "\n".join(out) + "\n", buffers, symbols,
                            sorted({a.decl_type for a in self.accumulators}), checks=list(self.checks))

    def _function(self, xs, rs, lines, split, inner: list[str] | None = None) -> KernelSource:
        k = self.kernel
        body: list[str] = []
        nx = len(xs)
        if nx:
            heads = [f"for (int64_t x{d} = 0; x{d} < {xs[d]}; x{d}++) {{" for d in range(nx)]
            pointwise = not k.rsizes
            collapse = max(1, nx - 1) if pointwise else nx
            work = k.numel * k.rnumel
            # Every point of a pointwise kernel is independent: `omp simd` on the innermost loop
            # says so (the __restrict__ of the parameters does not reach OpenMP's outlined body).
            simd = pointwise and nx == 1
            parallel = "#pragma omp parallel for simd" if simd else "#pragma omp parallel for"
            if not split and work.is_Integer and int(work) >= PARALLEL_MIN_WORK:
                body.append(f"{parallel} collapse({collapse})")
            elif not split and not work.is_Integer:
                body.append(f"{parallel} collapse({collapse}) if({self.index(work)} >= {PARALLEL_MIN_WORK})")
            elif simd:
                body.append("#pragma omp simd")
            if inner is not None:  # hoisted values, then the innermost loop
                body += heads[:-1] + _indent(lines + ["#pragma omp simd", heads[-1]] + _indent(inner) + ["}"])
                body += ["}"] * (nx - 1)
            else:
                if pointwise and nx > 1:
                    heads.insert(nx - 1, "#pragma omp simd")
                body += heads + _indent(lines) + ["}"] * nx
        else:
            body += lines
        return self._source(body)


def _step(index: sympy.Expr, var: sympy.Symbol, hint: Callable[[sympy.Expr], int]) -> int | None:
    """How far ``index`` moves when loop variable ``var`` grows by one: a constant, or for
    floor divisions and remainders the move seen at two sample points when both agree (a
    reshaped view moves by its inner stride except at the edges); else None."""
    names = {s.name: s for s in index.free_symbols}
    if var.name not in names:
        return 0
    v = names[var.name]
    step = sympy.expand(index.xreplace({v: v + 1}) - index)
    if step.is_Integer:
        return int(step)
    loop_vars = [s for n, s in names.items() if n[0] in "xr" and n[1:].isdigit()]
    seen = set()
    for at in (0, 3):
        point = {s: sympy.Integer(at) for s in loop_vars}
        moved = index.xreplace({**point, v: sympy.Integer(at + 1)}) - index.xreplace(point)
        try:
            seen.add(int(hint(moved)))
        except (TypeError, ValueError, KeyError):  # (an indirect index: no fixed step)
            return None
    return seen.pop() if len(seen) == 1 else None


def _accumulator_bytes(acc: _Acc) -> int:
    """Bytes one point of ``acc`` takes in a column block's array (its accumulator struct:
    Welford keeps three values, argmax/argmin a value and an index)."""
    if acc.plain_sum is not None:
        return _CTYPE_BYTES.get(acc.plain_sum[0], 8)
    of = _CTYPE_BYTES.get(acc.decl_type[acc.decl_type.find("<") + 1:-1], 8)
    if acc.decl_type.startswith("fc_welford_acc"):
        return 3 * of
    if acc.decl_type.startswith(("fc_argmax_acc", "fc_argmin_acc")):
        return 16
    return of


_CTYPE_BYTES = {"float": 4, "double": 8, "bool": 1, "uint8_t": 1, "int8_t": 1, "int16_t": 2, "int32_t": 4,
                "int64_t": 8}


def _place_in_column_loop(v: _Val, loop: _Scope, before: _Scope, kept: list[_Val]) -> None:
    """Declare ``v`` in the reduction loop of a column kernel: a value that does not change
    along the reduction (and is not a constant) is computed in ``before``, once per point, and
    read back from its array (listed in ``kept``)."""
    if loop.visible(v):
        return
    if not v.in_loop() and (v.deps or v.acc is not None):  # (an earlier loop's result too)
        _place(v, before)
        kept.append(v)
        loop.lines.append(f"{v.ctype} {v.name} = {v.name}_col[fc_i];")
        loop.seen.add(v)
        return
    for d in v.deps:
        _place_in_column_loop(d, loop, before, kept)
    if v.decl:
        loop.lines.append(v.decl)
    loop.seen.add(v)


def _feeds_only_loop(v: _Val) -> bool:
    """Whether a store belongs inside the reduction loop: it stores a value computed there
    (a pointwise store of a reduction node's prologue), not one computed from an accumulator."""
    stack, seen = [v], set()
    while stack:
        x = stack.pop()
        if x in seen:
            continue
        seen.add(x)
        if x.acc is not None:
            return False
        stack.extend(x.deps)
    return True


class _Scope:
    """Where declarations go; a value declared in a scope is visible in its inner scopes."""

    def __init__(self, lines: list[str], parent: _Scope | None = None):
        self.lines = lines
        self.parent = parent
        self.seen: set[_Val] = set()  # the values themselves: ids of freed values get reused

    def visible(self, v: _Val) -> bool:
        return v in self.seen or (self.parent is not None and self.parent.visible(v))


def _place(v: _Val, scope: _Scope) -> None:
    """Declare ``v`` (after its dependencies) in ``scope`` unless it is visible there already."""
    if scope.visible(v):
        return
    if scope.parent is not None and not v.in_loop():
        _place(v, scope.parent)  # loop-invariant: computed once, before the loop
        return
    for d in v.deps:
        _place(d, scope)
    if v.decl:
        scope.lines.append(v.decl)
    scope.seen.add(v)


def _indent(lines: list[str]) -> list[str]:
    return ["  " + ln for ln in lines]


def generate_kernel(kernel: Kernel, buffer_dtype: Callable[[str], str], hint: Callable[[sympy.Expr], int],
                    threads: int | None = None) -> KernelSource:
    """C++ for one kernel; ``hint`` evaluates a size expression at its hint (for choosing how to
    parallelise), ``threads`` is the number of threads planned for. The kernel's internal buffers
    are never stored; one a later loop over ``r`` reads (fireclay-loops decides which) is
    recomputed by that loop."""
    return _KernelGen(kernel, buffer_dtype, hint, threads or os.cpu_count() or 1).generate()
