"""Translation between torch objects and fireclay-ir argument atoms and value types.

Every stage boundary of this package crosses here: the tracer turns torch call arguments into IR
arguments, the executor turns IR arguments back into torch objects.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import sympy
import torch

from fireclay_ir import Device, DType, IRError, Layout, MemoryFormat, ScalarType, TensorMeta, Value
from fireclay_shapes import dumps, parse, python_code

Dim = Any  # an int, or a symbolic size's expression string

_DTYPE_BY_NAME: dict[str, torch.dtype] = {}
for _name in ("float64", "float32", "float16", "bfloat16", "complex128", "complex64", "complex32",
              "int64", "int32", "int16", "int8", "uint8", "uint16", "uint32", "uint64", "bool",
              "float8_e4m3fn", "float8_e5m2", "float8_e4m3fnuz", "float8_e5m2fnuz"):
    if hasattr(torch, _name):
        _DTYPE_BY_NAME[_name] = getattr(torch, _name)
_NAME_BY_DTYPE = {v: k for k, v in _DTYPE_BY_NAME.items()}

_LAYOUT_BY_NAME = {"strided": torch.strided, "sparse_coo": torch.sparse_coo}
_FORMAT_BY_NAME = {
    "contiguous_format": torch.contiguous_format,
    "channels_last": torch.channels_last,
    "channels_last_3d": torch.channels_last_3d,
    "preserve_format": torch.preserve_format,
}


def dtype_name(dtype: torch.dtype) -> str:
    try:
        return _NAME_BY_DTYPE[dtype]
    except KeyError:
        raise IRError(f"dtype {dtype} has no fireclay-ir name") from None


def torch_dtype(name: str) -> torch.dtype:
    return _DTYPE_BY_NAME[name]


def device_name(device: torch.device) -> str:
    """'cuda:0' style names; a bare 'cuda' gets the current index so the IR is unambiguous."""
    if device.type == "cuda" and device.index is None:
        return f"cuda:{torch.cuda.current_device()}"
    return str(device)


def tensor_meta(t: torch.Tensor, device: torch.device | None = None) -> TensorMeta:
    """The IR type of a tensor; ``device`` overrides the tensor's own (meta) device. Symbolic
    sizes (``torch.SymInt``) become expression strings."""
    from fireclay_autograd.fake import ir_dim

    # Plain attribute reads: a fake's __torch_function__ has nothing to add to them, and going
    # through it for each of the six costs more than the rest of this function.
    with torch._C.DisableTorchFunctionSubclass():
        shape = tuple(ir_dim(s) for s in t.shape)
        strides = tuple(ir_dim(s) for s in t.stride())
        offset, dtype, own_device, requires_grad = t.storage_offset(), t.dtype, t.device, t.requires_grad
    return TensorMeta(
        dtype=dtype_name(dtype),
        shape=shape,
        strides=None if same_dims(strides, contiguous_strides(shape)) else strides,
        storage_offset=ir_dim(offset),
        device=device_name(device or own_device),
        requires_grad=bool(requires_grad),
    )


def contiguous_strides(shape: tuple[Dim, ...]) -> tuple[Dim, ...]:
    """Row-major strides (a size-0 dim counts as 1). Symbolic sizes are at least 2 (0 and 1
    are specialised), so their products need no ``max``."""
    if all(isinstance(s, int) for s in shape):
        strides, acc = [], 1
        for s in reversed(shape):
            strides.append(acc)
            acc *= max(int(s), 1)
        return tuple(reversed(strides))
    out: list[Any] = []
    acc_expr: Any = sympy.Integer(1)
    for s in reversed(shape):
        out.append(acc_expr)
        acc_expr = acc_expr * (parse(s) if isinstance(s, str) else sympy.Integer(max(s, 1)))
    return tuple(int(e) if e.is_Integer else dumps(e) for e in reversed(out))


def same_dims(a: tuple[Dim, ...], b: tuple[Dim, ...]) -> bool:
    """Whether two size tuples are equal (symbolic entries compared as expressions)."""
    if len(a) != len(b):
        return False
    for x, y in zip(a, b):
        if isinstance(x, int) and isinstance(y, int):
            if x != y:
                return False
        elif sympy.expand(_expr(x) - _expr(y)) != 0:
            return False
    return True


def _expr(d: Dim) -> sympy.Expr:
    return parse(d) if isinstance(d, str) else sympy.Integer(d)


def meta_strides(meta: TensorMeta) -> tuple[Dim, ...]:
    return tuple(meta.strides) if meta.strides is not None else contiguous_strides(meta.shape)


_EVAL_CACHE: dict[str, Any] = {}


def evaluate(d: Dim, values: Mapping[str, int]) -> int:
    """The value of size ``d`` with symbols bound to ``values``."""
    if isinstance(d, int):
        return d
    code = _EVAL_CACHE.get(d)
    if code is None:
        code = _EVAL_CACHE[d] = compile(python_code(parse(d)), f"<size {d}>", "eval")
    try:
        return int(eval(code, {"__builtins__": {"max": max, "min": min, "abs": abs}}, dict(values)))
    except NameError as e:
        raise IRError(f"size {d!r} uses a symbol that is not bound here ({e})") from None


def concrete_meta(meta: TensorMeta, values: Mapping[str, int]) -> TensorMeta:
    """``meta`` with every symbolic dim evaluated at ``values``."""
    if meta.is_static:
        return meta
    shape = tuple(evaluate(d, values) for d in meta.shape)
    strides = None if meta.strides is None else tuple(evaluate(d, values) for d in meta.strides)
    if strides is None:
        strides = contiguous_strides(shape)
    return meta.with_(shape=shape, strides=None if strides == contiguous_strides(shape) else strides,
                      storage_offset=evaluate(meta.storage_offset, values))


def empty_like_meta(meta: TensorMeta, device: str | torch.device = "meta",
                    values: Mapping[str, int] | None = None) -> torch.Tensor:
    """An uninitialised tensor with the metadata of ``meta`` (on the meta device by default);
    symbolic sizes take their ``values``."""
    if not meta.is_static:
        if values is None:
            raise IRError(f"symbolic shape {meta.shape} needs symbol values here")
        meta = concrete_meta(meta, values)
    needed = 1 + meta.storage_offset + sum((s - 1) * st for s, st in zip(meta.shape, meta_strides(meta)) if s > 0)
    if any(s == 0 for s in meta.shape):
        needed = meta.storage_offset
    base = torch.empty(max(needed, 0), dtype=torch_dtype(meta.dtype), device=device)
    return base.as_strided(meta.shape, meta_strides(meta), meta.storage_offset)


def example_tensors(values: Sequence[Value], sizes: Mapping[str, int] | None = None) -> list[torch.Tensor]:
    """Example tensors for graph inputs, made before any real one exists (the backward's, at
    compile time): the right dtype, sizes, strides and device, and unspecified values, except
    that integer and bool ones are zero (a backend that runs them indexes in bounds). Filling
    the floating ones, saved activations among them, would write every byte of them on each
    compile. ``sizes``: values of the symbols in symbolic shapes."""
    out = []
    for v in values:
        t = empty_like_meta(v.meta, v.meta.device, sizes)
        out.append(t if t.is_floating_point() or t.is_complex() else t.zero_())
    return out


def to_ir_atom(x: Any) -> Any:
    """torch enum objects to IR atoms; other non-tensor arguments pass through unchanged."""
    if isinstance(x, torch.dtype):
        return DType(dtype_name(x))
    if isinstance(x, torch.device):
        return Device(device_name(x))
    if isinstance(x, torch.layout):
        return Layout(str(x).removeprefix("torch."))
    if isinstance(x, torch.memory_format):
        return MemoryFormat(str(x).removeprefix("torch."))
    return x


def from_ir_atom(x: Any) -> Any:
    if isinstance(x, DType):
        return torch_dtype(x.name)
    if isinstance(x, Device):
        return torch.device(x.name)
    if isinstance(x, Layout):
        return _LAYOUT_BY_NAME[x.name]
    if isinstance(x, MemoryFormat):
        return _FORMAT_BY_NAME[x.name]
    return x


def scalar_type(x: Any) -> ScalarType:
    if isinstance(x, bool):
        return ScalarType("bool")
    if isinstance(x, int):
        return ScalarType("int")
    if isinstance(x, float):
        return ScalarType("float")
    return ScalarType("opaque")


def nbytes(meta: TensorMeta, hints: Mapping[str, int] | None = None) -> int:
    """Bytes a dense tensor of this type occupies (what saving it for the backward costs);
    symbolic sizes are counted at their ``hints``."""
    numel = 1
    for s in meta.shape:
        numel *= evaluate(s, hints or {})
    return numel * torch_dtype(meta.dtype).itemsize
