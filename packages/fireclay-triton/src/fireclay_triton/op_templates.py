"""fireclay-triton's op templates: the Triton spelling of each op of the loop-body vocabulary, as
an ops handler on fireclay-loops' kernel-emission kit (:mod:`fireclay_loops.backend`). Every
``ops.*`` call becomes a :class:`TritonValue`, one Triton statement with its dependencies; the
reductions are in :mod:`fireclay_triton.reduction_templates`, placement in
:mod:`fireclay_triton.kernel_codegen`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import sympy

from fireclay_loops.backend import KernelOps, Value
from fireclay_loops.backend.dtypes import is_float
from fireclay_loops.ops import BOOL_RESULT
from fireclay_triton.errors import CodegenError
from fireclay_triton.prelude import BINARY_MATH, UNARY_MATH

if TYPE_CHECKING:
    from fireclay_triton.kernel_codegen import TritonKernelGen

TL = {"float64": "tl.float64", "float32": "tl.float32", "float16": "tl.float16", "bfloat16": "tl.bfloat16",
      "int64": "tl.int64", "int32": "tl.int32", "int16": "tl.int16", "int8": "tl.int8", "uint8": "tl.uint8",
      "bool": "tl.int1"}


def literal(value: float) -> str:
    """Python text of a constant: ``float("inf")`` (or ``-inf``, ``nan``) where repr will not do."""
    if isinstance(value, float) and not math.isfinite(value):
        return f'float("{value}")'
    return repr(value)


def tl_dtype(dtype: str) -> str:
    if dtype not in TL:
        raise CodegenError(f"the Triton backend has no support for dtype {dtype}")
    return TL[dtype]


@dataclass(eq=False, kw_only=True)
class TritonValue(Value):
    """``name`` defined by ``code`` (a statement; several lines for some updates)."""

    dtype: str
    dims: frozenset = frozenset()  # subset of {"x", "r"}: the block axes the value varies along
    post: int = -1  # the latest stage whose reduction result it reads (it goes after that loop)
    parts: list[TritonValue] = field(default_factory=list)  # welford: mean, m2, count


class TritonOps(KernelOps):
    """The ``ops`` handler for one node of the kernel (``flat_r``: its flat reduction index)."""

    def __init__(self, gen: TritonKernelGen, flat_r: sympy.Expr):
        super().__init__(gen)
        self.gen = gen
        self.flat_r = flat_r

    # -- helpers
    def _val(self, expr: str, dtype: str, deps: list[TritonValue], dims=None, op: tuple = ()) -> TritonValue:
        def make() -> TritonValue:
            name = self.gen.fresh("tmp")
            return TritonValue(name=name, code=f"{name} = {expr}", deps=deps, dtype=dtype,
                               dims=frozenset().union(*(d.dims for d in deps)) if dims is None else frozenset(dims),
                               post=max((d.post for d in deps), default=-1), op=op)

        return self.gen.cached((expr, dtype), make)

    def _const(self, text: str, dtype: str) -> TritonValue:
        if dtype == "bfloat16" and self.gen.interpret:
            # Triton's interpreter cannot build a bfloat16 constant (its builder has no get_bf16):
            # made in float32 and cast, which rounds the literal to bfloat16 as a GPU's tl.full does
            return self._val(f"tl.full({self.gen.unit_shape}, {text}, tl.float32).to(tl.bfloat16)", dtype, [], ())
        return self._val(f"tl.full({self.gen.unit_shape}, {text}, {tl_dtype(dtype)})", dtype, [], ())

    def _pointer(self, buf: str, index) -> tuple[str, list[TritonValue], bool, frozenset]:
        text, deps, dims = self.gen.index(index)
        r = "r" in dims or any(d.in_loop() for d in deps)
        need = frozenset({"x", "r"}) if r else frozenset({"x"})
        if dims != need:  # a pointer must have the full block shape of its scope
            text = f"{'zxr' if r else 'zx'} + ({text})"
        return f"{self.gen.argument(buf)} + ({text})", deps, r, need

    # -- memory
    def load_memory(self, buf, index, mask):
        gen = self.gen
        ptr, deps, r, dims = self._pointer(buf, index)
        if mask is None and (buf, ptr) in gen.stored:  # written by this kernel: the value, not the memory
            return gen.stored[(buf, ptr)]
        live = ("xrmask" if r else "xmask") + ("" if mask is None else f" & {mask.name}")
        more = [] if mask is None else [mask]
        v = self._val(f"tl.load({ptr}, {live}, other=0)", gen.buffer_dtype(buf), deps + more,
                      dims.union(*(m.dims for m in more)))
        v.varying = v.varying or r or None
        return v

    def masked(self, value, mask):
        return self._val(f"tl.where({mask.name}, {value.name}, 0).to({tl_dtype(value.dtype)})", value.dtype,
                         [mask, value])

    def store_internal(self, buf, value):
        dtype = self.gen.buffer_dtype(buf)
        return self.to_dtype(value, dtype) if value.dtype != dtype else value

    def store_memory(self, buf, index, value):
        gen = self.gen
        dtype = gen.buffer_dtype(buf)
        ptr, deps, r, dims = self._pointer(buf, index)
        gen.stored[(buf, ptr)] = self.store_internal(buf, value)
        mask = "xrmask" if r else "xmask"
        v = TritonValue(name="", code=f"tl.store({ptr}, {value.name}.to({tl_dtype(dtype)}), {mask})",
                        deps=deps + [value], dtype=dtype, dims=dims, varying=r or None, post=value.post)
        gen.roots.append(v)
        return None

    def add_memory(self, buf, index, value):
        # Points of one program, and of other programs, may add at one element: an atomic add
        # (the wrapper clears the buffer before the launch). Its dtype is never a half type (the
        # lowering sums those in float32), which not every GPU adds atomically.
        dtype = self.gen.buffer_dtype(buf)
        ptr, deps, r, dims = self._pointer(buf, index)
        mask = "xrmask" if r else "xmask"
        v = TritonValue(name="", code=f"tl.atomic_add({ptr}, {value.name}.to({tl_dtype(dtype)}), {mask}, sem='relaxed')",
                        deps=deps + [value], dtype=dtype, dims=dims, varying=r or None, post=value.post)
        self.gen.roots.append(v)

    # -- values
    def constant(self, value, dtype):
        value = float(value) if is_float(dtype) else int(bool(value)) if dtype == "bool" else int(value)
        return self._const(literal(value), dtype)

    def index_expr(self, expr, dtype):
        text, deps, dims = self.gen.index(expr)
        if not dims and not deps:
            text = f"zx + ({text})"
            dims = frozenset({"x"})
        v = self._val(f"({text}).to({tl_dtype(dtype)})", dtype, deps, dims | frozenset().union(*(d.dims for d in deps)))
        v.varying = v.varying or "r" in dims or None
        return v

    def to_dtype(self, x, dtype):
        if dtype == "bool":
            return self._val(f"{x.name} != 0", dtype, [x])
        op = ("float_cast" if is_float(dtype) else "to_dtype", x)
        return self._val(f"{x.name}.to({tl_dtype(dtype)})", dtype, [x], op=op)

    def random(self, kind, seed, offset):
        text, deps, dims = self.gen.index(offset)
        if "x" not in dims:
            text = f"{'zxr' if 'r' in dims else 'zx'} + ({text})"
        v = self._val(f"fc_random({int(seed)}, {text}, {kind == 'randn'})", "float32", deps, dims | {"x"})
        v.varying = v.varying or "r" in dims or None
        return v

    def indirect_indexing(self, value, size, name):
        v = TritonValue(name=name, code=f"{name} = {value.name}.to(tl.int64)", deps=[value], dtype="int64",
                        dims=value.dims, post=value.post)
        self.gen.indirect[name] = v
        return None

    # checks: device-side asserts, as eager's CUDA kernels (and Inductor) assert; lanes outside the
    # block's mask (or the op's ``mask``) are not checked. The launcher compiles kernels with
    # checks in Triton's debug mode, without which ``tl.device_assert`` is a no-op.
    def check_bounds(self, value, size, negative, site, mask=None):
        n = self.gen.size_text(size)
        lo = f"-({n})" if negative else "0"
        return self._check("check_bounds", site, f"({lo} <= {value.name}) & ({value.name} < {n})", value, mask, n)

    def check_nonzero(self, value, site, mask=None):
        return self._check("check_nonzero", site, f"{value.name} != 0", value, mask)

    def _check(self, op, site, ok, value, mask, size=None):
        gen = self.gen
        check = gen.checks[gen.add_check(op, site)]
        r = value.in_loop() or (mask is not None and mask.in_loop())
        live = ("xrmask" if r or "r" in value.dims else "xmask") + (f" & {mask.name}" if mask is not None else "")
        name = gen.fresh("chk")
        message = str(check.error(size=size))
        gen.check_messages.append(message)
        line = f"tl.device_assert(({ok}) | ~({live}), {message!r})\n{name} = {value.name}"
        return TritonValue(name=name, code=line, deps=[value] + ([mask] if mask is not None else []), dtype=value.dtype,
                           dims=value.dims, post=value.post)

    def getitem(self, value, i):
        if not value.parts:
            raise CodegenError(f"getitem of {value.name}, which is not a multi-part reduction result")
        return value.parts[int(i)]

    # -- math
    def where(self, c, a, b):
        t = tl_dtype(b.dtype)
        return self._val(f"tl.where({c.name}, {a.name}, {b.name}).to({t})", b.dtype, [c, a, b])

    def unary(self, name, a):
        template = _template(name, a.dtype, _UNARY, _UNARY_INTEGER, _UNARY_BOOL)
        if template is None:
            return self._math(UNARY_MATH[name], name, a)
        dtype = "bool" if name in BOOL_RESULT else a.dtype
        return self._val(template.format(a=a.name, T=tl_dtype(dtype)), dtype, [a], op=(name, a))

    def binary(self, name, a, b):
        if name not in _BINARY:
            return self._math(BINARY_MATH[name], name, a, b)
        dtype = "bool" if name in BOOL_RESULT else a.dtype
        return self._val(_BINARY[name].format(a=a.name, b=b.name, T=tl_dtype(dtype)), dtype, [a, b], op=(name, a, b))

    def _math(self, spellings, name, *args):
        portable, libdevice = spellings
        text = portable if self.gen.interpret else libdevice
        if text is None:
            raise CodegenError(f"ops.{name} needs CUDA's libdevice, which Triton's interpreter cannot call: run "
                               "this program on a GPU (or with fireclay-cpp on the CPU)")
        dtype = args[0].dtype
        names = [a.name if is_float(a.dtype) else f"{a.name}.to(tl.float32)" for a in args]
        fields = dict(zip("ab", names))
        return self._val(f"({text.format(**fields)}).to({tl_dtype(dtype)})", dtype, list(args), op=(name, *args))

    def floordiv(self, a, b):
        t = tl_dtype(a.dtype)
        if is_float(a.dtype):
            return self._val(f"tl.floor({a.name} / {b.name}).to({t})", a.dtype, [a, b])
        q = self._val(f"{a.name} // {b.name}", a.dtype, [a, b])
        return self._val(f"tl.where((({a.name} % {b.name}) != 0) & (({a.name} < 0) != ({b.name} < 0)), "
                         f"{q.name} - 1, {q.name}).to({t})", a.dtype, [a, b, q])

    def remainder(self, a, b):
        r = self.binary("fmod", a, b)
        return self._val(f"tl.where(({r.name} != 0) & (({r.name} < 0) != ({b.name} < 0)), {r.name} + {b.name}, "
                         f"{r.name}).to({tl_dtype(a.dtype)})", a.dtype, [r, b])

    def pow(self, a, b):
        if not is_float(a.dtype):
            return self._val(f"fc_ipow({a.name}, {b.name}).to({tl_dtype(a.dtype)})", a.dtype, [a, b])
        return self._math(BINARY_MATH["pow"], "pow", a, b)

    def round(self, a):
        return self._math(UNARY_MATH["round"], "round", a) if is_float(a.dtype) else a


def _template(name: str, dtype: str, *tables: dict[str, str]) -> str | None:
    """The op's template for an operand of ``dtype``: its spelling for bool, then for integer
    operands where those differ, else the general one (None: a math function of the prelude)."""
    general, integer, boolean = tables
    if dtype == "bool" and name in boolean:
        return boolean[name]
    if not is_float(dtype) and name in integer:
        return integer[name]
    return general.get(name)


# Op templates: ``{a}``, ``{b}`` the operands' names, ``{T}`` the result's Triton type (the first
# operand's, or bool for comparisons and logical ops, which need no cast).
_BINARY = {
    "eq": "{a} == {b}", "ne": "{a} != {b}", "lt": "{a} < {b}", "le": "{a} <= {b}", "gt": "{a} > {b}",
    "ge": "{a} >= {b}", "add": "({a} + {b}).to({T})", "sub": "({a} - {b}).to({T})", "mul": "({a} * {b}).to({T})",
    "bitwise_and": "({a} & {b}).to({T})", "bitwise_or": "({a} | {b}).to({T})", "bitwise_xor": "({a} ^ {b}).to({T})",
    "logical_and": "({a} != 0) & ({b} != 0)", "logical_or": "({a} != 0) | ({b} != 0)",
    "logical_xor": "({a} != 0) ^ ({b} != 0)", "truediv": "({a} / {b}).to({T})", "fmod": "({a} % {b}).to({T})",
    "maximum": "fc_maximum({a}, {b}).to({T})", "minimum": "fc_minimum({a}, {b}).to({T})",
    "copysign": "tl.where(({b} < 0) | (({b} == 0) & (1.0 / {b} < 0)), -tl.abs({a}), tl.abs({a})).to({T})",
}
_UNARY = {
    "logical_not": "{a} == 0", "isnan": "{a} != {a}", "isinf": 'tl.abs({a}) == float("inf")',
    "neg": "(-{a}).to({T})", "relu": "(tl.where({a} < 0, 0, {a})).to({T})",
    "sigmoid": "(1.0 / (1.0 + tl.exp(-{a}))).to({T})", "reciprocal": "(1.0 / {a}).to({T})",
    "square": "({a} * {a}).to({T})", "floor": "(tl.floor({a})).to({T})", "ceil": "(tl.ceil({a})).to({T})",
    "trunc": "(tl.where({a} < 0, tl.ceil({a}), tl.floor({a}))).to({T})",
    "frac": "({a} - tl.where({a} < 0, tl.ceil({a}), tl.floor({a}))).to({T})",
    "abs": "(tl.abs({a})).to({T})", "bitwise_not": "(~{a}).to({T})",
    "sign": "(({a} > 0).to({T}) - ({a} < 0).to({T}) + tl.where({a} != {a}, {a}, 0)).to({T})",
}
_UNARY_INTEGER = {  # integer and bool operands
    "floor": "({a}).to({T})", "ceil": "({a}).to({T})", "trunc": "({a}).to({T})",
    "sign": "(({a} > 0).to({T}) - ({a} < 0).to({T})).to({T})",
}
_UNARY_BOOL = {"abs": "({a}).to({T})", "bitwise_not": "({a} == 0).to({T})"}
