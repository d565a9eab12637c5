"""Translation between torch objects and fireclay-ir argument atoms and value types.

Every stage boundary of this package crosses here: the tracer turns torch call arguments into IR
arguments, the executor turns IR arguments back into torch objects.
"""

from __future__ import annotations

from typing import Any

import torch

from fireclay_ir import Device, DType, IRError, Layout, MemoryFormat, ScalarType, TensorMeta

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
    """The IR type of a tensor; ``device`` overrides the tensor's own (meta) device."""
    shape = tuple(int(s) for s in t.shape)
    strides = tuple(int(s) for s in t.stride())
    contiguous = strides == contiguous_strides(shape)
    return TensorMeta(
        dtype=dtype_name(t.dtype),
        shape=shape,
        strides=None if contiguous else strides,
        storage_offset=int(t.storage_offset()),
        device=device_name(device or t.device),
        requires_grad=bool(t.requires_grad),
    )


def contiguous_strides(shape: tuple[int, ...]) -> tuple[int, ...]:
    strides, acc = [], 1
    for s in reversed(shape):
        strides.append(acc)
        acc *= max(int(s), 1)
    return tuple(reversed(strides))


def meta_strides(meta: TensorMeta) -> tuple[int, ...]:
    return tuple(meta.strides) if meta.strides is not None else contiguous_strides(meta.shape)


def empty_like_meta(meta: TensorMeta, device: str | torch.device = "meta") -> torch.Tensor:
    """An uninitialised tensor with the metadata of ``meta`` (on the meta device by default)."""
    if not meta.is_static:
        raise IRError(f"symbolic shapes are not supported here yet: {meta.shape}")
    needed = 1 + meta.storage_offset + sum((s - 1) * st for s, st in zip(meta.shape, meta_strides(meta)) if s > 0)
    if any(s == 0 for s in meta.shape):
        needed = meta.storage_offset
    base = torch.empty(max(needed, 0), dtype=torch_dtype(meta.dtype), device=device)
    return base.as_strided(meta.shape, meta_strides(meta), meta.storage_offset)


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


def nbytes(meta: TensorMeta) -> int:
    """Bytes a dense tensor of this type occupies (what saving it for the backward costs)."""
    numel = 1
    for s in meta.shape:
        if not isinstance(s, int):
            raise IRError(f"symbolic shapes are not supported here yet: {meta.shape}")
        numel *= s
    return numel * torch_dtype(meta.dtype).itemsize
