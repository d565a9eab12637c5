"""One scheduled kernel as one ``@triton.jit`` function.

Each node body is replayed (``LoopBody.run``) on :class:`_TritonValues`, a handler that turns
every ``ops.*`` call into a :class:`_Val`: one Triton statement with its dependencies. Placement
comes after, on demand, like a scheduler of statements:

* a *pointwise* kernel is one flat block of ``XBLOCK`` points (``x`` index, 1D);
* a *reduction* kernel works on ``[XBLOCK, RBLOCK]`` tiles: outer points down, reduction
  points across. Values that read a reduction variable (``r``) live in the *loop* scope; the
  rest (``[XBLOCK, 1]``) in the *main* scope, before the loop when the loop needs them, after
  it when they read a reduction result.

Reductions keep a ``[XBLOCK, RBLOCK]`` accumulator, updated once per tile and reduced across
``RBLOCK`` after the loop (``tl.reduce`` with the combine functions of the prelude; Welford
keeps mean, m2 and count per lane and merges them with Chan's formula).

*Persistent* reductions (the whole reduction fits one tile, ``RBLOCK >= rnumel``) have no loop:
everything is one scope, so a value loaded for one stage is reused by the next (softmax reads
its input once). *Looped* reductions run one ``for`` over ``r`` per stage
(``KernelNode.stage``): a node reading a reduction result of its own kernel runs in a later loop.
"""

from __future__ import annotations

import hashlib
import math
import re
from collections.abc import Callable
from dataclasses import dataclass, field

import sympy

from fireclay_loops import Kernel
from fireclay_loops.backend import KernelEmitter
from fireclay_shapes import triton_code
from fireclay_triton.errors import CodegenError
from fireclay_triton.prelude import BINARY_MATH, UNARY_MATH
from fireclay_triton.split_reduction import SPLITTABLE, finisher_source, place_split_stage, split_result
from fireclay_triton.tiling import (
    COLUMN_PERSISTENT_LIMIT,
    NotSplittable,
    few_long_rows,
    reduces_columns,
    should_split,
    tiled_kernel,
)

TL = {"float64": "tl.float64", "float32": "tl.float32", "float16": "tl.float16", "bfloat16": "tl.bfloat16",
      "int64": "tl.int64", "int32": "tl.int32", "int16": "tl.int16", "int8": "tl.int8", "uint8": "tl.uint8",
      "bool": "tl.int1"}
INT32_LIMIT = 2**31 - 1
_CMP = {"eq": "==", "ne": "!=", "lt": "<", "le": "<=", "gt": ">", "ge": ">="}
_ARITH = {"add": "+", "sub": "-", "mul": "*", "bitwise_and": "&", "bitwise_or": "|", "bitwise_xor": "^"}


def tl_dtype(dtype: str) -> str:
    if dtype not in TL:
        raise CodegenError(f"the Triton backend has no support for dtype {dtype}")
    return TL[dtype]


def _is_float(dtype: str) -> bool:
    return dtype in ("float64", "float32", "float16", "bfloat16")


@dataclass(eq=False)
class _Val:
    """``name`` defined by ``line`` (a statement; several lines for some updates)."""

    name: str
    line: str
    deps: list[_Val]
    dtype: str
    dims: frozenset  # subset of {"x", "r"}: the block axes the value varies along
    r: bool  # computed inside the reduction loop
    post: int = -1  # the latest stage whose reduction result it reads (it goes after that loop)
    parts: list[_Val] = field(default_factory=list)  # welford: mean, m2, count
    op: tuple = ()  # (op name, operand values...) for the few ops reduction patterns look for


@dataclass
class KernelSource:
    """A kernel's Triton function, the arguments it takes, and how to launch it."""

    name: str  # the scheduled kernel's name (the wrapper's launcher)
    source: str
    buffers: list[str]  # pointer arguments, in this order
    symbols: list[str]  # then integer sizes
    kind: str  # "pointwise", "tiled" (2D pointwise), "persistent", "looped" or "split"
    numel: sympy.Expr  # outer points
    rnumel: sympy.Expr  # reduction points (1 for pointwise kernels)
    index64: bool
    columns: bool = False  # a reduction whose accesses are contiguous along the outer points
    partials: int = 0  # split kernels: the workspace slots of partial results (per chunk and output)
    # the kernel's checks (fireclay-loops' CheckSites) and their assert messages: the launcher
    # compiles it in Triton's debug mode and, in the interpreter, raises the check's error
    checks: list = field(default_factory=list)
    # the ``@triton.jit`` function's name in the kernel module: ``k`` + a digest of its text written
    # with a placeholder name. Arguments are positional (``ptr0``, ``ptr1``...), so kernels that do
    # the same work on different buffers (the layers of a model) are one function, compiled once,
    # and a function's name is the same in every program and process (Triton's disk cache hits).
    function: str = ""


class _TritonValues:
    """The ``ops`` handler for one node of the kernel."""

    def __init__(self, gen: _KernelGen, flat_r: sympy.Expr):
        self.gen = gen
        self.flat_r = flat_r

    # -- helpers
    def _val(self, expr: str, dtype: str, deps: list[_Val], dims=None, op: tuple = ()) -> _Val:
        gen = self.gen
        key = (expr, dtype)
        if key in gen.cse:
            return gen.cse[key]
        dims = frozenset().union(*(d.dims for d in deps)) if dims is None else frozenset(dims)
        name = gen.fresh("tmp")
        v = _Val(name, f"{name} = {expr}", deps, dtype, dims, any(d.r for d in deps),
                 max((d.post for d in deps), default=-1), op=op)
        gen.cse[key] = v
        return v

    def _const(self, text: str, dtype: str) -> _Val:
        return self._val(f"tl.full({self.gen.unit_shape}, {text}, {tl_dtype(dtype)})", dtype, [], ())

    def _pointer(self, buf: str, index) -> tuple[str, list[_Val], bool, frozenset]:
        text, deps, dims = self.gen.index(index)
        r = "r" in dims or any(d.r for d in deps)
        need = frozenset({"x", "r"}) if r else frozenset({"x"})
        if dims != need:  # a pointer must have the full block shape of its scope
            text = f"{'zxr' if r else 'zx'} + ({text})"
        return f"{self.gen.argument(buf)} + ({text})", deps, r, need

    # -- memory
    def load(self, buf, index):
        gen = self.gen
        if buf in gen.kernel.internal:
            return gen.internal_value(buf)
        ptr, deps, r, dims = self._pointer(buf, index)
        if (buf, ptr) in gen.stored:  # written by this kernel: take the value, not the memory
            return gen.stored[(buf, ptr)]
        gen.use_buffer(buf, write=False)
        mask = "xrmask" if r else "xmask"
        v = self._val(f"tl.load({ptr}, {mask}, other=0)", gen.buffer_dtype(buf), deps, dims)
        v.r = v.r or r
        return v

    def masked_load(self, buf, index, mask):
        gen = self.gen
        if buf in gen.kernel.internal:
            inner = gen.internal_value(buf)
            return self._val(f"tl.where({mask.name}, {inner.name}, 0).to({tl_dtype(inner.dtype)})", inner.dtype,
                             [mask, inner])
        ptr, deps, r, dims = self._pointer(buf, index)
        gen.use_buffer(buf, write=False)
        scope = "xrmask" if r else "xmask"
        v = self._val(f"tl.load({ptr}, {scope} & {mask.name}, other=0)", gen.buffer_dtype(buf), deps + [mask],
                      dims | mask.dims)
        v.r = v.r or r
        return v

    def store(self, buf, index, value):
        gen = self.gen
        dtype = gen.buffer_dtype(buf)
        if buf in gen.kernel.internal:
            # round as a trip through memory would, so fused half-precision code matches eager
            gen.internal[buf] = self.to_dtype(value, dtype) if value.dtype != dtype else value
            return None
        ptr, deps, r, dims = self._pointer(buf, index)
        gen.use_buffer(buf, write=True)
        gen.stored[(buf, ptr)] = self.to_dtype(value, dtype) if value.dtype != dtype else value
        mask = "xrmask" if r else "xmask"
        v = _Val("", f"tl.store({ptr}, {value.name}.to({tl_dtype(dtype)}), {mask})", deps + [value], dtype, dims,
                 r or value.r, value.post)
        gen.roots.append(v)
        return None

    store_reduction = store

    # -- values
    def constant(self, value, dtype):
        if dtype == "bool":
            return self._const("1" if value else "0", dtype)
        if _is_float(dtype):
            v = float(value)
            text = repr(v) if math.isfinite(v) else f'float("{v}")'
            return self._const(text, dtype)
        return self._const(str(int(value)), dtype)

    def index_expr(self, expr, dtype):
        text, deps, dims = self.gen.index(expr)
        if not dims and not deps:
            text = f"zx + ({text})"
            dims = frozenset({"x"})
        v = self._val(f"({text}).to({tl_dtype(dtype)})", dtype, deps, dims | frozenset().union(*(d.dims for d in deps)))
        v.r = v.r or "r" in dims
        return v

    def to_dtype(self, x, dtype):
        if dtype == "bool":
            return self._val(f"{x.name} != 0", dtype, [x])
        return self._val(f"{x.name}.to({tl_dtype(dtype)})", dtype, [x], op=("to_dtype", x))

    def random(self, kind, seed, offset):
        text, deps, dims = self.gen.index(offset)
        if "x" not in dims:
            text = f"{'zxr' if 'r' in dims else 'zx'} + ({text})"
        v = self._val(f"fc_random({int(seed)}, {text}, {kind == 'randn'})", "float32", deps, dims | {"x"})
        v.r = v.r or "r" in dims
        return v

    def indirect_indexing(self, value, size, name):
        v = _Val(name, f"{name} = {value.name}.to(tl.int64)", [value], "int64", value.dims, value.r, value.post)
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
        r = value.r or (mask is not None and mask.r)
        live = ("xrmask" if r or "r" in value.dims else "xmask") + (f" & {mask.name}" if mask is not None else "")
        name = gen.fresh("chk")
        message = str(check.error(size=size))
        gen.check_messages.append(message)
        line = f"tl.device_assert(({ok}) | ~({live}), {message!r})\n{name} = {value.name}"
        return _Val(name, line, [value] + ([mask] if mask is not None else []), value.dtype, value.dims, r, value.post)

    def reduction(self, dtype, src_dtype, reduction_type, value):
        return self.gen.reduction(self, dtype, src_dtype, reduction_type, value)

    def getitem(self, value, i):
        if not value.parts:
            raise CodegenError(f"getitem of {value.name}, which is not a multi-part reduction result")
        return value.parts[int(i)]

    # -- math
    def where(self, c, a, b):
        t = tl_dtype(b.dtype)
        return self._val(f"tl.where({c.name}, {a.name}, {b.name}).to({t})", b.dtype, [c, a, b])

    def __getattr__(self, name):
        if name.startswith("_"):
            raise AttributeError(name)
        if name in _CMP:
            return lambda a, b: self._val(f"{a.name} {_CMP[name]} {b.name}", "bool", [a, b])
        if name in _ARITH:
            return lambda a, b: self._val(f"({a.name} {_ARITH[name]} {b.name}).to({tl_dtype(a.dtype)})", a.dtype,
                                          [a, b], op=(name, a, b))
        if name in ("logical_and", "logical_or", "logical_xor"):
            op = {"logical_and": "&", "logical_or": "|", "logical_xor": "^"}[name]
            return lambda a, b: self._val(f"({a.name} != 0) {op} ({b.name} != 0)", "bool", [a, b])
        binary = getattr(self, f"_b_{name}", None)
        if binary is not None:
            return binary
        unary = getattr(self, f"_u_{name}", None)
        if unary is not None:
            return unary
        if name in UNARY_MATH:
            return lambda a: self._math(UNARY_MATH[name], name, a)
        if name in BINARY_MATH:
            return lambda a, b: self._math(BINARY_MATH[name], name, a, b)
        raise AttributeError(name)

    def _math(self, spellings, name, *args):
        portable, libdevice = spellings
        text = portable if self.gen.interpret else libdevice
        if text is None:
            raise CodegenError(f"ops.{name} needs CUDA's libdevice, which Triton's interpreter cannot call: run "
                               "this program on a GPU (or with fireclay-cpp on the CPU)")
        dtype = args[0].dtype
        names = [a.name if _is_float(a.dtype) else f"{a.name}.to(tl.float32)" for a in args]
        fields = dict(zip("ab", names))
        return self._val(f"({text.format(**fields)}).to({tl_dtype(dtype)})", dtype, list(args), op=(name, *args))

    def _b_truediv(self, a, b):
        return self._val(f"({a.name} / {b.name}).to({tl_dtype(a.dtype)})", a.dtype, [a, b])

    def _b_floordiv(self, a, b):
        t = tl_dtype(a.dtype)
        if _is_float(a.dtype):
            return self._val(f"tl.floor({a.name} / {b.name}).to({t})", a.dtype, [a, b])
        q = self._val(f"{a.name} // {b.name}", a.dtype, [a, b])
        return self._val(f"tl.where((({a.name} % {b.name}) != 0) & (({a.name} < 0) != ({b.name} < 0)), "
                         f"{q.name} - 1, {q.name}).to({t})", a.dtype, [a, b, q])

    def _b_fmod(self, a, b):
        return self._val(f"({a.name} % {b.name}).to({tl_dtype(a.dtype)})", a.dtype, [a, b])

    def _b_remainder(self, a, b):
        r = self._b_fmod(a, b)
        return self._val(f"tl.where(({r.name} != 0) & (({r.name} < 0) != ({b.name} < 0)), {r.name} + {b.name}, "
                         f"{r.name}).to({tl_dtype(a.dtype)})", a.dtype, [r, b])

    def _b_pow(self, a, b):
        if not _is_float(a.dtype):
            return self._val(f"fc_ipow({a.name}, {b.name}).to({tl_dtype(a.dtype)})", a.dtype, [a, b])
        return self._math(BINARY_MATH["pow"], "pow", a, b)

    def _b_maximum(self, a, b):
        return self._val(f"fc_maximum({a.name}, {b.name}).to({tl_dtype(a.dtype)})", a.dtype, [a, b])

    def _b_minimum(self, a, b):
        return self._val(f"fc_minimum({a.name}, {b.name}).to({tl_dtype(a.dtype)})", a.dtype, [a, b])

    def _b_copysign(self, a, b):
        return self._val(f"tl.where(({b.name} < 0) | (({b.name} == 0) & (1.0 / {b.name} < 0)), -tl.abs({a.name}), "
                         f"tl.abs({a.name})).to({tl_dtype(a.dtype)})", a.dtype, [a, b])

    def _unary(self, template: str, a: _Val, dtype: str | None = None) -> _Val:
        dtype = dtype or a.dtype
        return self._val(f"({template.format(a=a.name)}).to({tl_dtype(dtype)})", dtype, [a])

    def _u_neg(self, a):
        return self._unary("-{a}", a)

    def _u_abs(self, a):
        return self._unary("{a}" if a.dtype == "bool" else "tl.abs({a})", a)

    def _u_relu(self, a):
        return self._unary("tl.where({a} < 0, 0, {a})", a)

    def _u_sigmoid(self, a):
        return self._unary("1.0 / (1.0 + tl.exp(-{a}))", a)

    def _u_reciprocal(self, a):
        return self._unary("1.0 / {a}", a)

    def _u_square(self, a):
        return self._unary("{a} * {a}", a)

    def _u_floor(self, a):
        return self._unary("tl.floor({a})" if _is_float(a.dtype) else "{a}", a)

    def _u_ceil(self, a):
        return self._unary("tl.ceil({a})" if _is_float(a.dtype) else "{a}", a)

    def _u_trunc(self, a):
        return self._unary("tl.where({a} < 0, tl.ceil({a}), tl.floor({a}))" if _is_float(a.dtype) else "{a}", a)

    def _u_round(self, a):
        return self._math(UNARY_MATH["round"], "round", a) if _is_float(a.dtype) else a

    def _u_frac(self, a):
        return self._unary("{a} - tl.where({a} < 0, tl.ceil({a}), tl.floor({a}))", a)

    def _u_sign(self, a):
        t = tl_dtype(a.dtype)
        nan = " + tl.where({a} != {a}, {a}, 0)" if _is_float(a.dtype) else ""
        return self._unary(f"({{a}} > 0).to({t}) - ({{a}} < 0).to({t}){nan}", a)

    def _u_bitwise_not(self, a):
        return self._unary("{a} == 0" if a.dtype == "bool" else "~{a}", a)

    def _u_logical_not(self, a):
        return self._val(f"{a.name} == 0", "bool", [a])

    def _u_isnan(self, a):
        return self._val(f"{a.name} != {a.name}", "bool", [a])

    def _u_isinf(self, a):
        return self._val(f'tl.abs({a.name}) == float("inf")', "bool", [a])


_INIT = {"sum": "0", "prod": "1", "any": "0", "all": "1"}


def _extreme(dtype: str, largest: bool) -> str:
    if _is_float(dtype):
        return 'float("inf")' if largest else 'float("-inf")'
    if dtype == "bool":
        return "1" if largest else "0"
    bits = {"int64": 64, "int32": 32, "int16": 16, "int8": 8}.get(dtype)
    if bits is None:  # uint8
        return "255" if largest else "0"
    return str(2 ** (bits - 1) - 1) if largest else str(-(2 ** (bits - 1)))


class _KernelGen(KernelEmitter):
    def __init__(self, kernel: Kernel, buffer_dtype: Callable[[str], str],
                 storage_numel: Callable[[str], sympy.Expr], interpret: bool, persistent_limit: int,
                 tiled: bool = False, columns: bool = False, split: bool = False):
        super().__init__(kernel)
        self.storage_numel = storage_numel
        self.buffer_dtype = buffer_dtype
        self.interpret = interpret
        self.reducing = bool(kernel.rsizes)
        self.unit_shape = "[1, 1]" if self.reducing else "[1]"
        self.internal: dict[str, _Val] = {}
        self.stored: dict[tuple[str, str], _Val] = {}  # (buffer, pointer text) -> value stored there
        self.cse: dict = {}
        self.roots: list[_Val] = []
        self.finals: list[_Val] = []  # reduction results of the stage being generated
        self.stage = 0
        self.main: list[str] = []  # the function body, as placed so far
        self.loop_marks: dict[int, list[int]] = {}  # looped stage -> [its "for" line, its loop's end] in main
        self.max_results: dict[_Val, tuple[_Val, int]] = {}  # max result -> (the value reduced, its stage)
        self._canon_memo: dict[_Val, str] = {}
        self.arguments: dict[str, str] = {}  # buffer -> its pointer argument, in order of first use
        self.xnames = {v.name for v in kernel.xvars}
        rnumel = kernel.rnumel
        self.columns = columns
        if columns:
            persistent_limit = min(persistent_limit, COLUMN_PERSISTENT_LIMIT)
        if tiled:
            self.kind = "tiled"
        elif not self.reducing:
            self.kind = "pointwise"
        elif rnumel.is_Integer and int(rnumel) <= persistent_limit:
            self.kind = "persistent"
        else:
            self.kind = "looped"
        self.split = split and self.kind == "looped"
        if self.split:
            self.kind = "split"
        self.looped = self.kind in ("looped", "split")
        self.slots = 0  # split kernels: workspace slots of partial results so far
        self.split_partials: list[_Val] = []  # split kernels: this stage's partial results, after the loop
        self.finisher: list[str] = []  # split kernels: the finisher's body
        self.finisher_seen: set[_Val] = set()
        self.index64 = self._needs_index64()
        self.check_messages: list[str] = []  # the assert message of each of self.checks

    def _needs_index64(self) -> bool:
        """32-bit indices unless some size is symbolic or an offset may pass 2**31 - 1."""
        k = self.kernel
        extents = [k.numel * k.rnumel]
        for kn in k.nodes:
            for b, _, _ in kn.reads() + kn.writes():
                if b not in k.internal:
                    extents.append(self.storage_numel(b))
        return any(not sympy.sympify(e).is_Integer or int(e) >= INT32_LIMIT for e in extents)

    def argument(self, buf: str) -> str:
        """The pointer argument that stands for ``buf`` in the kernel's text."""
        found = self.arguments.get(buf)
        if found is None:
            found = self.arguments[buf] = f"ptr{len(self.arguments)}"
        return found

    def internal_value(self, buf: str) -> _Val:
        if buf not in self.internal:
            raise CodegenError(f"{buf} is read in {self.kernel.name} before the kernel computes it")
        return self.internal[buf]

    def index(self, expr) -> tuple[str, list[_Val], frozenset]:
        """Triton text of an index expression, the indirect values it reads, and its block axes."""
        expr = sympy.sympify(expr)
        deps, dims = [], set()
        for s in sorted(expr.free_symbols, key=lambda s: s.name):  # one text in every process
            if s.name in self.xnames:
                dims.add("x")
            elif s.name in self.rnames:
                dims.add("r")
            elif s.name in self.indirect:
                deps.append(self.indirect[s.name])
                dims |= self.indirect[s.name].dims
            else:
                self.symbols.add(s.name)
        return triton_code(expr, ranges=self.symbol_range), deps, frozenset(dims)

    def size_text(self, expr) -> str:
        text, _, _ = self.index(expr)
        return text

    # -- reductions
    def reduction(self, h: _TritonValues, dtype, src_dtype, reduction_type, value: _Val) -> _Val:
        if not self.reducing:  # a reduction over nothing: the value itself (welford: x, 0, 1)
            if reduction_type == "welford":
                zero = h.constant(0.0, dtype)
                one = h.constant(1.0, dtype)
                out = h.to_dtype(value, dtype)
                res = _Val(out.name, "", [out], dtype, out.dims, out.r, out.post, [out, zero, one])
                return res
            if reduction_type in ("argmax", "argmin"):
                return h._const("0", "int64")
            return h.to_dtype(value, dtype)
        if self.split and (self.stage != 0 or reduction_type not in SPLITTABLE or dtype != "float32"):
            raise NotSplittable(f"a {reduction_type} in {dtype} at stage {self.stage}")
        acc = self.fresh("acc")
        full = "[XBLOCK, RBLOCK]"
        xr = frozenset({"x", "r"})
        if reduction_type in ("argmax", "argmin"):
            vt = "int8" if src_dtype == "bool" else src_dtype
            init = _Val(acc, f"{acc}_v = tl.full({full}, 0, {tl_dtype(vt)})\n{acc}_i = tl.full({full}, -1, tl.int64)",
                        [], vt, xr, False)
            ridx, ideps, _ = self.index(self.flat_r_of(h))
            combine = f"fc_{reduction_type}_combine"
            update = _Val("", f"{acc}_v, {acc}_i = {combine}({acc}_v, {acc}_i, {value.name}.to({tl_dtype(vt)}) + "
                          f"tl.zeros({full}, {tl_dtype(vt)}), tl.where(xrmask, (zxr + ({ridx})).to(tl.int64), -1))",
                          [init, value] + ideps, vt, xr, True)
            res = self.fresh("red")
            if self.interpret:
                # the interpreter runs a custom combine element by element: use builtin reductions
                # (numpy's max and min propagate NaN, like torch's argmax and argmin)
                pick = "tl.max" if reduction_type == "argmax" else "tl.min"
                empty = _extreme(vt, largest=reduction_type == "argmin")
                line = (f"{res}_v = {pick}(tl.where({acc}_i >= 0, {acc}_v, {empty}), 1)[:, None]\n"
                        f"{res}_hit = (({acc}_v == {res}_v) | (({acc}_v != {acc}_v) & ({res}_v != {res}_v))) "
                        f"& ({acc}_i >= 0)\n"
                        f"{res}_i = tl.min(tl.where({res}_hit, {acc}_i, 9223372036854775807), 1)")
            else:
                line = f"{res}_v, {res}_i = tl.reduce(({acc}_v, {acc}_i), 1, {combine})"
            done = _Val(f"{res}_i[:, None]", line, [update], "int64", frozenset({"x"}), False, self.stage)
        elif reduction_type == "welford" and self.kind == "persistent":
            # the whole row is in registers: the mean, then the squares about it (two sums, no
            # division per element, and more accurate than merging per-lane Welford states)
            t = tl_dtype(dtype)
            update = _Val("", f"{acc}_x = tl.where(xrmask, {value.name}.to({t}), 0.0)", [value], dtype, xr, True)
            res = self.fresh("red")
            done = _Val(res, "\n".join([
                f"{res}_w = tl.sum(rmask.to({t}), 1)[:, None]",
                f"{res}_mean = tl.sum({acc}_x, 1)[:, None] / tl.where({res}_w == 0, 1.0, {res}_w)",
                f"{res}_dm = tl.where(xrmask, {acc}_x - {res}_mean, 0.0)",
                f"{res}_m2 = tl.sum({res}_dm * {res}_dm, 1)[:, None]"]),
                [update], dtype, frozenset({"x"}), False, self.stage)
            done.parts = [_Val(f"{res}_{p}", "", [done], dtype, frozenset({"x"}), False, self.stage)
                          for p in ("mean", "m2", "w")]
        elif reduction_type == "welford":
            t = tl_dtype(dtype)
            init = _Val(acc, "\n".join(f"{acc}_{p} = tl.zeros({full}, {t})" for p in ("mean", "m2", "w")),
                        [], dtype, xr, False)
            v = f"{value.name}.to({t})"
            update = _Val("", "\n".join([
                f"{acc}_d = {v} - {acc}_mean",
                f"{acc}_wn = {acc}_w + 1.0",
                f"{acc}_mn = {acc}_mean + {acc}_d / {acc}_wn",
                f"{acc}_mean = tl.where(xrmask, {acc}_mn, {acc}_mean)",
                f"{acc}_m2 = tl.where(xrmask, {acc}_m2 + {acc}_d * ({v} - {acc}_mn), {acc}_m2)",
                f"{acc}_w = tl.where(xrmask, {acc}_wn, {acc}_w)"]), [init, value], dtype, xr, True)
            res = self.fresh("red")
            # merge the lanes' partial results: M2 = sum(m2_i) + sum(w_i * (mean_i - mean)**2)
            done = _Val(res, "\n".join([
                f"{res}_w = tl.sum({acc}_w, 1)[:, None]",
                f"{res}_mean = tl.sum({acc}_w * {acc}_mean, 1)[:, None] / tl.where({res}_w == 0, 1.0, {res}_w)",
                f"{res}_dm = {acc}_mean - {res}_mean",
                f"{res}_m2 = tl.sum({acc}_m2 + {acc}_w * {res}_dm * {res}_dm, 1)[:, None]"]),
                [update], dtype, frozenset({"x"}), False, self.stage)
            done.parts = [_Val(f"{res}_{p}", "", [done], dtype, frozenset({"x"}), False, self.stage)
                          for p in ("mean", "m2", "w")]
        else:
            if reduction_type == "sum" and self.kind == "looped" and _is_float(dtype):
                found = self._online_softmax_source(value)
                if found is not None:
                    return self._online_sum(dtype, *found)
            if reduction_type in ("any", "all"):
                t, v = "tl.int8", f"({value.name} != 0).to(tl.int8)"
                init_text = _INIT[reduction_type]
            else:
                t, v = tl_dtype(dtype), f"{value.name}.to({tl_dtype(dtype)})"
                init_text = _INIT.get(reduction_type) or _extreme(dtype, reduction_type == "min")
            step = {"sum": f"{acc} + {v}", "prod": f"{acc} * {v}", "max": f"fc_maximum({acc}, {v})",
                    "min": f"fc_minimum({acc}, {v})", "any": f"tl.maximum({acc}, {v})",
                    "all": f"tl.minimum({acc}, {v})"}[reduction_type]
            init = _Val(acc, f"{acc} = tl.full({full}, {init_text}, {t})", [], dtype, xr, False)
            update = _Val("", f"{acc} = tl.where(xrmask, {step}, {acc})", [init, value], dtype, xr, True)
            final = {"sum": f"tl.sum({acc}, 1)", "prod": f"tl.reduce({acc}, 1, fc_prod_combine)",
                     "max": f"tl.reduce({acc}, 1, fc_maximum)", "min": f"tl.reduce({acc}, 1, fc_minimum)",
                     **({"max": f"tl.max({acc}, 1)", "min": f"tl.min({acc}, 1)"} if self.interpret else {}),
                     "any": f"tl.max({acc}, 1) != 0", "all": f"tl.min({acc}, 1) != 0"}[reduction_type]
            res = self.fresh("red")
            done = _Val(res, f"{res} = ({final})[:, None]", [update], dtype, frozenset({"x"}), False, self.stage)
            if reduction_type == "max" and self.kind == "looped" and _is_float(dtype):
                self.max_results[done] = (value, self.stage)
        if self.split:
            done = split_result(self, reduction_type, dtype, done)
        self.roots.append(update)
        self.finals.append(done)
        return done

    # -- online softmax: sum(exp(a - max(a))) in the loop that computes max(a)
    def _canon(self, v: _Val) -> str:
        """The value's expression with its operands spelt out: equal for the same computation
        in two stages (whose statements have different names)."""
        got = self._canon_memo.get(v)
        if got is None:
            expr = v.line.split(" = ", 1)[1] if " = " in v.line and "\n" not in v.line else v.line
            names = {d.name: self._canon(d) for d in v.deps}
            got = re.sub(r"[A-Za-z_]\w*", lambda m: names.get(m.group(0), m.group(0)), expr)
            self._canon_memo[v] = got
        return got

    def _online_softmax_source(self, value: _Val) -> tuple[_Val, int] | None:
        """For ``sum(exp(a - m))`` where ``m = max(a)`` was reduced by an earlier loop of this
        kernel: (``a`` as that loop computed it, that loop's stage)."""
        def strip(v: _Val) -> _Val:
            while v.op and v.op[0] == "to_dtype" and _is_float(v.dtype):
                v = v.op[1]
            return v

        e = strip(value)
        if e.op[:1] != ("exp",):
            return None
        d = strip(e.op[1])
        if d.op[:1] != ("sub",):
            return None
        a, m = d.op[1], strip(d.op[2])
        found = self.max_results.get(m)
        if found is None or found[1] >= self.stage or found[1] not in self.loop_marks:
            return None
        if self._canon(strip(a)) != self._canon(strip(found[0])):
            return None
        return found

    def _insert(self, pos: int, lines: list[str], outside_loop_of: int | None = None) -> None:
        self.main[pos:pos] = lines
        for stage, mark in self.loop_marks.items():
            for i in (0, 1):
                if mark[i] > pos or (mark[i] == pos and not (stage == outside_loop_of and i == 1)):
                    mark[i] += len(lines)

    def _online_sum(self, dtype: str, a: _Val, stage: int) -> _Val:
        """Keep a running max and a sum rescaled to it per lane in the loop of ``stage`` (which
        already reads ``a``), so the row is read once for both reductions, not twice.

        Per lane: ``s = s * exp(m_old - m_new) + exp(a - m_new)``; lanes merge as
        ``sum(s_lane * exp(m_lane - m))``. A lane whose max is still -inf holds no sum; it gives
        NaN only when the whole row is -inf, as ``exp(-inf - -inf)`` does in eager."""
        acc, res = self.fresh("acc"), self.fresh("red")
        t, full, ninf = tl_dtype(dtype), "[XBLOCK, RBLOCK]", 'float("-inf")'
        pre = [f"{acc}_m = tl.full({full}, {ninf}, {t})", f"{acc}_s = tl.zeros({full}, {t})",
               f"{acc}_seen = tl.zeros({full}, tl.int8)"]
        loop = [f"{acc}_v = {a.name}.to({t})",
                f"{acc}_mn = tl.where(xrmask, fc_maximum({acc}_m, {acc}_v), {acc}_m)",
                f"{acc}_s = tl.where(xrmask, {acc}_s * tl.where({acc}_mn == {ninf}, 1.0, tl.exp({acc}_m - {acc}_mn)) "
                f"+ tl.where({acc}_mn == {ninf}, 0.0, tl.exp({acc}_v - {acc}_mn)), {acc}_s)",
                f"{acc}_m = {acc}_mn",
                f"{acc}_seen = tl.maximum({acc}_seen, xrmask.to(tl.int8))"]
        lane_max = f"tl.max({acc}_m, 1)" if self.interpret else f"tl.reduce({acc}_m, 1, fc_maximum)"
        post = [f"{res}_m = ({lane_max})[:, None]",
                f"{res}_c = tl.where({acc}_m == {ninf}, tl.where(({acc}_seen != 0) & ({res}_m == {ninf}), "
                f'float("nan"), 0.0), {acc}_s * tl.exp({acc}_m - {res}_m))',
                f"{res} = (tl.sum({res}_c, 1))[:, None].to({t})"]
        mark = self.loop_marks[stage]
        self._insert(mark[0], pre)
        self._insert(mark[1], ["    " + ln for ln in loop])
        self._insert(mark[1], post, outside_loop_of=stage)
        return _Val(res, "", [], dtype, frozenset({"x"}), False, stage)

    def flat_r_of(self, h: _TritonValues) -> sympy.Expr:
        return h.flat_r

    # -- generation
    def generate(self) -> KernelSource:
        k = self.kernel
        stages: dict[int, list] = {}
        for kn in k.nodes:
            stages.setdefault(kn.stage, []).append(kn)
        main = self.main
        main_seen: set[_Val] = set()  # the values themselves: ids of freed values get reused
        for stage in sorted(stages):
            if self.looped:
                self.cse = {}  # values of an earlier loop are out of scope
            self.roots = []
            self.finals = []
            self.stage = stage
            for kn in stages[stage]:
                body = kn.node.body
                flat = sympy.Integer(0)
                for rv, size in zip(body.reduction_vars, body.reduction_sizes):
                    flat = flat * size + kn.var_map.get(rv, rv)
                body.run(_TritonValues(self, flat), kn.var_map)
            self._place_stage(main, main_seen)
        return self._function(main)

    def _place_stage(self, main: list[str], main_seen: set[_Val]) -> None:
        if self.split:
            place_split_stage(self, main, main_seen)
            return
        looped = self.looped
        pre: list[str] = []
        loop: list[str] = [] if looped else pre
        loop_seen: set[_Val] = set() if looped else main_seen
        post: list[str] = [] if looped else pre

        def place(v: _Val, target: list[str]) -> None:
            seen = loop_seen if v.r else main_seen
            if v in seen:
                return
            if v.r and target is not loop and looped:
                raise CodegenError(f"kernel {self.kernel.name}: a value computed in the reduction loop is needed "
                                   "after it")
            if v.post >= self.stage and target is pre and looped:
                raise CodegenError(f"kernel {self.kernel.name}: a reduction result is needed inside its own loop")
            for d in v.deps:
                place(d, loop if d.r else target if target is not loop else pre)
            if v.line:
                (loop if v.r else target).extend(v.line.split("\n"))
            seen.add(v)

        for v in self.roots:
            if v.r:
                place(v, loop)
        for v in self.roots + self.finals:  # results of reductions whose stores are internal, too
            if not v.r:
                place(v, post)
        if not looped:
            main.extend(pre)
            return
        main.extend(pre)
        if loop:
            start = len(main)
            main.append("for roffset in range(0, rnumel, RBLOCK):")
            rdefs = ["rindex = roffset + rbase", "rmask = rindex < rnumel", "xrmask = xmask & rmask"]
            rdefs += self._var_defs("r", "rindex")
            main.extend("    " + ln for ln in rdefs + loop)
            self.loop_marks[self.stage] = [start, len(main)]
        main.extend(post)

    def _var_defs(self, which: str, flat: str) -> list[str]:
        k = self.kernel
        names = k.xvars if which == "x" else k.rvars
        sizes = k.xsizes if which == "x" else k.rsizes
        lines = []
        for j, (v, _) in enumerate(zip(names, sizes)):
            inner = sympy.Integer(1)
            for s in sizes[j + 1:]:
                inner = inner * s
            text = flat if inner == 1 else f"{flat} // ({self.size_text(inner)})"
            if j > 0:
                text = f"({text}) % ({self.size_text(sizes[j])})"
            lines.append(f"{v.name} = {text}")
        return lines

    def _function(self, body: list[str]) -> KernelSource:
        k = self.kernel
        i64 = ".to(tl.int64)" if self.index64 else ""
        itype = "tl.int64" if self.index64 else "tl.int32"
        head: list[str] = []
        if self.reducing:
            head += [f"xoffset = tl.program_id(0){i64} * XBLOCK",
                     f"xindex = xoffset + tl.arange(0, XBLOCK)[:, None]{i64}",
                     "xmask = xindex < xnumel",
                     f"rbase = tl.arange(0, RBLOCK)[None, :]{i64}",
                     f"zx = tl.zeros([XBLOCK, 1], {itype})",
                     f"zxr = tl.zeros([XBLOCK, RBLOCK], {itype})"]
            head += self._var_defs("x", "xindex")
            if self.kind == "persistent":
                head += ["rindex = rbase", "rmask = rindex < rnumel", "xrmask = xmask & rmask"]
                head += self._var_defs("r", "rindex")
            elif self.kind == "split":
                head += [f"rstart = tl.program_id(1){i64} * rchunk"]
            elif self.kind == "tiled":  # columns of the tile from grid axis 1
                head += [f"rindex = tl.program_id(1){i64} * RBLOCK + rbase", "rmask = rindex < rnumel",
                         "xrmask = xmask & rmask"]
                head += self._var_defs("r", "rindex")
        else:
            head += [f"xoffset = tl.program_id(0){i64} * XBLOCK",
                     f"xindex = xoffset + tl.arange(0, XBLOCK){i64}",
                     "xmask = xindex < xnumel",
                     f"zx = tl.zeros([XBLOCK], {itype})"]
            head += self._var_defs("x", "xindex")
        buffers = list(self.arguments)
        symbols = sorted(self.symbols)
        params = [self.arguments[b] for b in buffers] + symbols + \
            (["ws", "rchunk: tl.constexpr" if self.interpret else "rchunk"] if self.split else []) + ["xnumel"]
        # Triton's interpreter cannot loop to a runtime bound (numpy refuses int() of its 1-element
        # arrays): there the reduction length is a compile-time constant, which costs nothing.
        rnumel = "rnumel: tl.constexpr" if self.interpret and self.looped else "rnumel"
        params += [rnumel, "XBLOCK: tl.constexpr", "RBLOCK: tl.constexpr"] if self.reducing else \
            ["XBLOCK: tl.constexpr"]

        def text(function: str) -> str:
            lines = ["@triton.jit", f"def {function}({', '.join(params)}):"]
            lines += ["    " + ln for ln in head + body]
            source = "\n".join(lines) + "\n"
            if self.split:
                source += "\n" + finisher_source(function, params, self._var_defs("x", "xindex"), self.finisher,
                                                 self.index64)
            return source

        function = "k" + hashlib.sha256(text("kernel").encode()).hexdigest()[:20]
        return KernelSource(k.name, text(function), buffers, symbols, self.kind, k.numel,
                            k.rnumel if self.reducing else sympy.Integer(1), self.index64, self.columns,
                            self.slots, checks=list(zip(self.checks, self.check_messages)), function=function)


def generate_kernel(kernel: Kernel, buffer_dtype: Callable[[str], str],
                    storage_numel: Callable[[str], sympy.Expr], interpret: bool,
                    persistent_limit: int = 16384) -> KernelSource:
    """Triton for one kernel. ``storage_numel(buffer)`` is the elements a buffer spans (it decides
    32- or 64-bit indexing); ``interpret`` spells math for Triton's CPU interpreter; reductions of
    at most ``persistent_limit`` points are persistent (column reductions: at most
    ``COLUMN_PERSISTENT_LIMIT``); pointwise kernels whose accesses are contiguous along different
    variables are 2D tiled (see :mod:`fireclay_triton.tiling`)."""
    tiled = tiled_kernel(kernel)
    if tiled is not None:
        return _KernelGen(tiled, buffer_dtype, storage_numel, interpret, persistent_limit, tiled=True).generate()
    columns = reduces_columns(kernel)
    if (columns and should_split(kernel)) or few_long_rows(kernel):
        try:
            return _KernelGen(kernel, buffer_dtype, storage_numel, interpret, persistent_limit, columns=columns,
                              split=True).generate()
        except NotSplittable:
            pass  # an epilogue or another reduction: one program per column block
    try:
        return _KernelGen(kernel, buffer_dtype, storage_numel, interpret, persistent_limit, columns=columns).generate()
    except CodegenError:
        if not columns:
            raise
        # the loop structure a column-shaped looped kernel needs did not fit: one tile, as for rows
        return _KernelGen(kernel, buffer_dtype, storage_numel, interpret, persistent_limit).generate()
