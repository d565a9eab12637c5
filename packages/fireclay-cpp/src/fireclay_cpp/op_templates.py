"""fireclay-cpp's op templates: the C++ spelling of each op of the loop-body vocabulary, as an
ops handler on fireclay-loops' kernel-emission kit (:mod:`fireclay_loops.backend`). Every
``ops.*`` call becomes a :class:`CValue`, a C++ declaration with its dependencies; the kernel
generator (:mod:`fireclay_cpp.kernel_codegen`) places them.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import sympy

from fireclay_cpp.errors import CodegenError
from fireclay_cpp.prelude import CTYPES, VECTOR_MATH
from fireclay_loops.backend import KernelOps, Value
from fireclay_loops.backend.dtypes import as_float32
from fireclay_loops.backend.reductions import REDUCTIONS
from fireclay_loops.ops import BOOL_RESULT
from fireclay_shapes import cpp_code

if TYPE_CHECKING:
    from fireclay_cpp.kernel_codegen import CppKernelGen


def ctype(dtype: str, storage: bool = False) -> str:
    """The C++ type values of ``dtype`` are computed in (``storage``: stored in)."""
    if dtype not in CTYPES:
        raise CodegenError(f"the C++ backend has no support for dtype {dtype}")
    return CTYPES[dtype][0 if storage else 1]


@dataclass(eq=False, kw_only=True)
class CValue(Value):
    """A C++ value: ``code`` is the declaration of ``name`` (or a side effect), of type ``ctype``."""

    ctype: str = ""
    acc: Accumulator | None = None  # set on reduction values: they live in an accumulator
    bounds: BoundsCheck | None = None  # set on ops.check_bounds values: a loop may check them first
    read: tuple[str, Any] | None = None  # (buffer, index) of an int64 value that is a plain load
    loaded: str | None = None  # the buffer a load reads
    load_index: Any = None  # the index a plain or masked load of memory reads at
    exact: str | None = None  # the declaration with the scalar twins of its vector-math calls
    # (declaration, dependencies, mask) in a column kernel, whose vectorised loop runs along
    # the innermost kept dim, where the mask does not change along it (a load or select)
    column_form: tuple[str, list[CValue], CValue] | None = None


@dataclass(eq=False, kw_only=True)
class Accumulator:
    """A reduction's accumulator (a ``fc_<kind>_acc<T>`` of the prelude) and its update."""

    name: str
    kind: str  # the reduction's kind (its form: fireclay_loops.backend.reductions)
    ctype: str  # the type it adds values in
    value: CValue  # the value added
    decl_type: str  # the prelude's struct
    plain_sum: bool  # a float sum: a plain variable with OpenMP's `+` (as is Welford's first pass)
    add_stmt: CValue | None = None


@dataclass(eq=False, kw_only=True)
class BoundsCheck:
    """An index check a loop can make before it runs (see ``CppKernelGen``): a check inside a
    vectorised loop is a branch and a call that keep the loop scalar, so a loop whose indices
    vary along it first scans them (a min/max reduction, which vectorises) and then runs with
    the indices unchecked, or not at all when one is out of range."""

    site: int  # the kernel's check number
    value: CValue  # the index checked
    low: str  # C++ text of the bounds: low <= index < size
    size: str
    live: CValue | None  # the mask: a masked-off index is not checked
    read: tuple[str, Any] | None  # (buffer, index) the index is loaded from, unmasked, checked in [0, size)
    checked_code: str  # the declaration checking on its own (a scalar check)
    unchecked_code: str  # the declaration once a scan has checked the loop's indices

    def scan(self, low_var: str, high_var: str) -> CValue:
        """The scan's update of the running minimum and maximum index."""
        v, live = self.value.name, self.live
        low_in = f"{live.name} ? {v} : INT64_MAX" if live is not None else v
        high_in = f"{live.name} ? {v} : INT64_MIN" if live is not None else v
        code = (f"{low_var} = fc_minimum<int64_t>({low_var}, {low_in}); "
                f"{high_var} = fc_maximum<int64_t>({high_var}, {high_in});")
        return CValue(name=f"{low_var}_scan", code=code, deps=[self.value] + ([live] if live is not None else []),
                      varying=True)


# math functions: the prelude's fc_<name> (round to nearest even is nearbyint)
_UNARY_CALL = {name: f"fc_{name}" for name in (
    "exp", "exp2", "expm1", "log", "log2", "log10", "log1p", "sqrt", "sin", "cos", "tan", "asin", "acos", "atan",
    "sinh", "cosh", "tanh", "asinh", "acosh", "atanh", "erf", "erfc", "floor", "ceil", "trunc", "lgamma")}
_UNARY_CALL["round"] = "fc_nearbyint"
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


# a max or min whose second operand is a float constant, not NaN (a clamp's bound): the NaN
# test on it folds away (see the prelude's fc_maximum_test_b)
_BOUNDED = {"maximum": "fc_maximum_test_b<{T}>({a}, {b})", "minimum": "fc_minimum_test_b<{T}>({a}, {b})"}
_BLENDED = ("float", "double", "int64_t", "int32_t")  # the types fc_blend selects bits of
_COMPARISONS = frozenset({"eq", "ne", "lt", "le", "gt", "ge"})


def _float_literal(v: float) -> str:
    if math.isnan(v):
        return "FC_NAN"
    if math.isinf(v):
        return ("-" if v < 0 else "") + "FC_INF"
    return repr(float(v))


def _int_literal(v: int) -> str:
    if v == -(2**63):
        return "(-9223372036854775807LL - 1)"
    return f"{v}LL" if abs(v) >= 2**31 else str(v)



class CppOps(KernelOps):
    """The ``ops`` handler: builds :class:`CValue` graphs for one node body."""

    def __init__(self, gen: CppKernelGen, prefix: str, ridx: str):
        super().__init__(gen)
        self.gen = gen
        self.prefix = prefix
        self.ridx = ridx  # the flat reduction index of this node (argmax/argmin positions)
        self.count = 0

    def _val(self, expr: str, ctype_: str, deps: list[CValue], varying: bool | None = None,
             loads: str | None = None, exact: str | None = None) -> CValue:
        """The value of ``expr`` (the kernel's own if it computed it already from the same
        dependencies); ``loads``: the buffer ``expr`` reads, whose reads a store makes stale;
        ``exact``: ``expr`` with the scalar twins of vector-math functions (see
        :meth:`_same_bits_everywhere`)."""
        def make() -> CValue:
            name = f"{self.prefix}t{self.count}"
            self.count += 1
            value = CValue(name=name, code="", deps=deps, ctype=ctype_, varying=varying, loaded=loads)
            # A bool computed outside the vectorised loop and read inside it (a concatenation's,
            # a pad's or a window's mask) keeps GCC from vectorising the loop ("no vectype" for
            # the invariant bool); held in an int32_t (0 or 1: the initialiser converts) it
            # vectorises as a lane mask. Its C++ users read it as a truth value either way.
            decl = "int32_t" if ctype_ == "bool" and not value.in_loop() else ctype_
            value.code = f"{decl} {name} = {expr};"
            if exact is not None:
                value.exact = f"{decl} {name} = {exact};"
            return value

        return self.gen.cached((loads, expr, ctype_, tuple(id(d) for d in deps)), make)

    def _index(self, index) -> tuple[str, list[CValue]]:
        expr, deps = self.gen.read_index(index)
        return cpp_code(expr, ranges=self.gen.symbol_range), deps

    def _varies(self, index) -> bool | None:
        """True when ``index`` names a reduction variable; else the dependencies decide."""
        names = {s.name for s in sympy.sympify(index).free_symbols}
        return True if names & self.gen.rnames else None

    # memory
    def load_memory(self, buf, index, mask):
        text, deps = self._index(index)
        dtype = self.gen.buffer_dtype(buf)
        self.gen.accesses.append(index)
        t, read = ctype(dtype), _WIDEN.get(dtype, "{}").format(f"{buf}[{text}]")
        if mask is not None and not deps:
            unmasked = self._load_under_invariant_mask(buf, index, mask, dtype)
            if unmasked is not None:
                return self._select(mask, f"({t})({unmasked.name})", f"{t}(0)", t, [unmasked, mask])
        column = self._column_load(buf, index, mask, dtype) if mask is not None and not deps else None
        if mask is not None:
            read, deps = f"{mask.name} ? ({t})({read}) : {t}(0)", deps + [mask]
        value = self._val(read, t, deps, self._varies(index), loads=buf)
        value.load_index = index
        if column is not None:
            value.column_form = (f"{t} {value.name} = fc_blend({mask.name}, ({t})({column[0]}), {t}(0));",
                                 [column[1], mask], mask)
        if dtype == "int64" and mask is None:
            value.read = (buf, index)
        return value

    def _load_under_invariant_mask(self, buf: str, index: Any, mask: CValue, dtype: str) -> CValue | None:
        """The load the loop makes whatever the mask, from a place inside the buffer where the
        mask is false: GCC does not vectorise a load under a mask that does not change along the
        loop (a concatenation's part, a pad, a padded window's row: in or out as a whole), but
        does an unconditional one. None, and the load stays masked, where the mask changes along
        the loop or the proof is missing (see :meth:`_offset_load`)."""
        if mask.in_loop():
            return None
        found = self._offset_load(buf, index, mask, dtype, {s for s in self.gen.rnames})
        if found is None:
            return None
        return self._val(found[0], ctype(dtype), [found[1]], True, loads=buf)

    def _column_load(self, buf: str, index: Any, mask: CValue, dtype: str) -> tuple[str, CValue] | None:
        """The unconditional read of a masked load for a column kernel (see
        :mod:`fireclay_cpp.column_loops`), whose vectorised loop runs along the innermost kept
        dim: (its text, the offset it reads at) where the index has a part along that dim."""
        if not self.gen.kernel.rsizes or not self.gen.kernel.xsizes:
            return None
        if ctype(dtype) not in _BLENDED:
            return None
        return self._offset_load(buf, index, mask, dtype, {f"x{len(self.gen.kernel.xsizes) - 1}"})

    def _offset_load(self, buf: str, index: Any, mask: CValue, dtype: str,
                     loop_names: set[str]) -> tuple[str, CValue] | None:
        """(the text of an unconditional read, the offset value it reads at) for a load under
        ``mask`` inside a loop over ``loop_names``. The index splits into its part along the
        loop and the rest; where the mask is false the rest is replaced by an offset from which
        every index the loop reads lies between the buffer's least and greatest element (its
        layout's extent: memory the kernel is given whole). None where the proof is missing: a
        layout of symbolic or empty extent, a loop of symbolic length, a coefficient that is
        not a number, no part along the loop."""
        expr = sympy.expand(sympy.sympify(index))
        loop_vars = {s for s in expr.free_symbols if s.name in loop_names}
        extent = self.gen.buffer_extent(buf)
        if not loop_vars or extent is None:
            return None
        along = sympy.Add(*[term for term in sympy.Add.make_args(expr) if term.free_symbols & loop_vars])
        low = high = 0  # the least and greatest of `along` over the loop
        for term in sympy.Add.make_args(along):
            coeff, var = term.as_coeff_Mul()
            if not coeff.is_Integer or var not in loop_vars:
                return None
            r = self.gen.symbol_range(var)
            if not (isinstance(r.lo, int) and isinstance(r.hi, int)):
                return None
            ends = (int(coeff) * r.lo, int(coeff) * r.hi)
            low, high = low + min(ends), high + max(ends)
        if high - low > extent[1] - extent[0]:
            return None
        rest = self.gen.index(sympy.expand(expr - along))
        safe = extent[0] - low  # (safe + along runs from the extent's first element on)
        offset = self._val(f"{mask.name} ? (int64_t)({rest}) : (int64_t)({safe})", "int64_t", [mask])
        return _WIDEN.get(dtype, "{}").format(f"{buf}[{offset.name} + {self.gen.index(along)}]"), offset

    def masked(self, value, mask):
        # (the stored value by its own name: a float32 store keeps the value itself, no copy)
        return self._val(f"{mask.name} ? {value.name} : {value.ctype}(0)", value.ctype, [value, mask])

    def store_internal(self, buf, value):
        dtype = self.gen.buffer_dtype(buf)
        t = ctype(dtype)
        if dtype not in ("float16", "bfloat16") and value.ctype == t:
            return value  # a read of it is the value (and math on it is shared)
        val = CValue(name=f"int_{buf}", code=f"{t} int_{buf} = {_round_half(dtype, f'({t})({value.name})')};",
                     deps=[value], ctype=t)
        self.gen.roots.append(val)
        return val

    def store_memory(self, buf, index, value):
        dtype = self.gen.buffer_dtype(buf)
        text, deps = self._index(index)
        self.gen.accesses.append(index)
        self.gen.cse = {k: v for k, v in self.gen.cse.items() if k[0] != buf}  # its reads are stale
        self.gen.stored.add(buf)
        stmt = CValue(name=f"{self.prefix}st{self.count}", code=f"{buf}[{text}] = {_narrow(dtype, value.name)};",
                      deps=deps + [value], varying=self._varies(index))
        self.count += 1
        self.gen.roots.append(stmt)
        return None

    def add_memory(self, buf, index, value):
        # (the kernel runs serially: see CppKernelGen.serial)
        text, deps = self._index(index)
        self.gen.accesses.append(index)
        self.gen.cse = {k: v for k, v in self.gen.cse.items() if k[0] != buf}
        self.gen.stored.add(buf)
        stmt = CValue(name=f"{self.prefix}add{self.count}", code=f"{buf}[{text}] += {value.name};",
                      deps=deps + [value], varying=self._varies(index))
        self.count += 1
        self.gen.roots.append(stmt)

    # values
    def constant(self, value, dtype):
        t = ctype(dtype)
        if dtype == "bool":
            return self._val("true" if value else "false", t, [])
        if dtype.startswith(("float", "bfloat")):
            # (the literal rounded as the cast rounds it: equal constants then read equal)
            value = as_float32(float(value)) if t == "float" else float(value)
            value_ = self._val(f"({t})({_float_literal(value)})", t, [])
            value_.op = ("float_constant", value)  # (a max or min with it tests only the other side)
            return value_
        value_ = self._val(f"({t})({_int_literal(int(value))})", t, [])
        value_.op = ("constant", int(value))  # (a comparison with an index may split the loop)
        return value_

    def index_expr(self, expr, dtype):
        text, deps = self._index(expr)
        t = ctype(dtype)
        value = self._val(f"({t})({text})", t, deps, self._varies(expr))
        if not deps:
            value.op = ("index_expr", sympy.sympify(expr))
        return value

    def to_dtype(self, x, dtype):
        t = ctype(dtype)
        value = self._val(_round_half(dtype, f"({t})({x.name})"), t, [x])
        if x.read is not None and t == x.ctype:
            value.read = x.read
        return value

    def random(self, kind, seed, offset):
        text, deps = self._index(offset)
        fn = "fc_rand" if kind == "rand" else "fc_randn"
        return self._val(f"{fn}((uint64_t){int(seed)}ULL, {text})", "float", deps, self._varies(offset))

    def indirect_indexing(self, value, size, name):
        val = CValue(name=name, code=f"int64_t {name} = (int64_t)({value.name});", deps=[value], ctype="int64_t")
        self.gen.indirect[name] = val
        return None

    # checks: a failure is recorded in the run's error slot `fc_err` (see the prelude)
    def check_bounds(self, value, size, negative, site, mask=None):
        n, deps = self._index(size)
        live = [mask] if mask is not None else []
        k = self.gen.add_check("check_bounds", site)
        low = f"-({n})" if negative else "0"
        expr = f"fc_check_bounds({value.name}, {low}, {n}, {mask.name if live else 'true'}, {k}, fc_err)"
        checked = self._val(expr, "int64_t", [value] + deps + live)
        checked.bounds = BoundsCheck(site=k, value=value, low=low, size=n, live=mask if live else None,
                                     read=value.read if not live and not negative else None,
                                     checked_code=checked.code,
                                     unchecked_code=f"int64_t {checked.name} = {value.name};")
        self.gen.bounds_checks.append(checked)
        return checked

    def check_nonzero(self, value, site, mask=None):
        live = [mask] if mask is not None else []
        k = self.gen.add_check("check_nonzero", site)
        return self._val(f"fc_check_nonzero<{value.ctype}>({value.name}, {mask.name if live else 'true'}, {k}, fc_err)",
                         value.ctype, [value] + live)

    def accumulate(self, kind, *, dtype, src_dtype, value):
        """Every kind is an accumulator struct of the prelude, updated once per point."""
        form = REDUCTIONS[kind]
        t = ctype(src_dtype if form.of_values or form.truth else dtype)
        if form.selects:
            self._same_bits_everywhere([value])  # (its gradient compares the values with it)
        acc = Accumulator(name=self.gen.fresh("acc"), kind=kind, ctype=t, value=value, decl_type=f"fc_{kind}_acc<{t}>",
                          plain_sum=kind == "sum" and t in ("float", "double"))
        acc.add_stmt = CValue(name=f"{acc.name}_add", code=f"{acc.name}.add(({t})({value.name}), {self.ridx});",
                              deps=[value], varying=True)
        self.gen.accumulators.append(acc)
        self.gen.roots.append(acc.add_stmt)
        if kind == "welford":
            return CValue(name=acc.name, code="", ctype=t, acc=acc)
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

    def unary(self, name, a):
        t = "bool" if name in ("logical_not", "isnan", "isinf") else a.ctype
        exact = None
        if name == "bitwise_not":
            expr = f"!({a.name})" if a.ctype == "bool" else f"~({a.name})"
        elif name in _UNARY_CALL:
            arg = a.name if a.ctype in ("float", "double") else f"(double)({a.name})"
            expr = f"{_UNARY_CALL[name]}({arg})"
            if name in VECTOR_MATH:
                exact = f"({t})(fc_exact_{name}({arg}))"
        else:
            expr = _UNARY_TEMPLATE[name].format(a=a.name, T=a.ctype)
            if name == "sigmoid":
                exact = f"({t})(fc_exact_sigmoid<{a.ctype}>({a.name}))"
        return self._val(f"({t})({expr})", t, [a], exact=exact)

    def binary(self, name, a, b):
        t = "bool" if name in BOOL_RESULT else a.ctype
        template = _BINARY_TEMPLATE[name]
        if name in _BOUNDED and t in ("float", "double") and b.op[:1] == ("float_constant",) and not math.isnan(b.op[1]):
            template = _BOUNDED[name]
        expr = template.format(a=a.name, b=b.name, T=t)
        exact = None
        if name in VECTOR_MATH and t in ("float", "double"):
            exact = f"({t})(fc_exact_{name}(({t})({a.name}), ({t})({b.name})))"
        if name in _COMPARISONS:
            self._same_bits_everywhere([a, b])
            self.gen.note_comparison(name, a, b)
        return self._val(f"({t})({expr})", t, [a, b], exact=exact)

    def where(self, c, a, b):
        t = a.ctype  # the recorder gives where the dtype of its first value
        return self._select(c, f"({t})({a.name})", f"({t})({b.name})", t, [c, a, b])

    def _select(self, c: CValue, a: str, b: str, t: str, deps: list[CValue]) -> CValue:
        """``c ? a : b``; a bit blend (``fc_blend``) where ``c`` does not change along the loop
        and the value does: GCC keeps a loop scalar for a ``?:`` on a loop-invariant condition."""
        if t in ("float", "double") and not c.in_loop() and any(d.in_loop() for d in deps):
            return self._val(f"fc_blend({c.name}, {a}, {b})", t, deps)
        value = self._val(f"{c.name} ? {a} : {b}", t, deps)
        if t in _BLENDED:
            value.column_form = (f"{t} {value.name} = fc_blend({c.name}, {a}, {b});", deps, c)
        return value

    def _same_bits_everywhere(self, values: list[CValue]) -> None:
        """Compute the vector-math calls ``values`` read with their scalar twins (the prelude's
        ``fc_exact_*``): the values are compared, with each other or with a max or min of
        them, so each must come out the same bits in every loop and kernel that computes it,
        vectorised or not. The twins keep the loops computing them scalar."""
        stack, seen = list(values), set()
        while stack:
            v = stack.pop()
            if v not in seen:
                seen.add(v)
                if v.exact is not None:
                    v.code = v.exact
                stack.extend(v.deps)


# the conversions of a half-precision value: read from memory (to float), stored (from float),
# and rounded as a trip through memory would round it (fused code then matches eager)
_WIDEN = {"bfloat16": "fc_bf16_to_float({})", "float16": "(float)({})"}
_NARROW = {"bfloat16": "fc_float_to_bf16((float)({}))"}
_ROUND_HALF = {"bfloat16": "fc_round_bf16({})", "float16": "fc_round_f16({})"}


def _narrow(dtype: str, text: str) -> str:
    return _NARROW.get(dtype, f"({ctype(dtype, storage=True)})({{}})").format(text)


def _round_half(dtype: str, text: str) -> str:
    return _ROUND_HALF.get(dtype, "{}").format(text)
