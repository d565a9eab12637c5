"""Dtype facts fireclay-loops needs without torch: sizes, categories and type promotion."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

ITEMSIZE = {
    "float64": 8, "float32": 4, "float16": 2, "bfloat16": 2,
    "int64": 8, "int32": 4, "int16": 2, "int8": 1, "uint8": 1, "bool": 1,
    "uint16": 2, "uint32": 4, "uint64": 8, "complex64": 8, "complex128": 16,
    "float8_e4m3fn": 1, "float8_e5m2": 1, "float8_e4m3fnuz": 1, "float8_e5m2fnuz": 1, "complex32": 4,
}
FLOATS = ("float64", "float32", "float16", "bfloat16")
# Loop bodies have no complex arithmetic: ops on complex tensors stay calls into the library.
COMPLEX = ("complex32", "complex64", "complex128")
INTS = ("int64", "int32", "int16", "int8", "uint8", "uint16", "uint32", "uint64")
# Ordered low to high, as torch's promotion lattice orders them within one category.
_RANK = ["bool", "uint8", "int8", "int16", "int32", "int64", "float16", "bfloat16", "float32", "float64"]


def is_float(dtype: str) -> bool:
    return dtype in FLOATS


def is_complex(dtype: str) -> bool:
    return dtype in COMPLEX


def is_int(dtype: str) -> bool:
    return dtype in INTS


def category(dtype: str) -> int:
    """0 bool, 1 integer, 2 floating."""
    return 2 if is_float(dtype) else (0 if dtype == "bool" else 1)


def promote_types(a: str, b: str) -> str:
    if a == b:
        return a
    if {a, b} == {"float16", "bfloat16"}:
        return "float32"
    if {a, b} == {"uint8", "int8"}:
        return "int16"
    return max(a, b, key=_RANK.index)


def scalar_dtype(value: Any) -> str:
    """The dtype a Python scalar takes part in promotion with (torch's default float dtype)."""
    if isinstance(value, bool):
        return "bool"
    if isinstance(value, int):
        return "int64"
    return "float32"


def _combine(higher: str | None, lower: str | None) -> str | None:
    # A weaker participant only matters when it is of a higher category.
    if higher is None:
        return lower
    if lower is None or is_float(higher):
        return higher
    if higher == "bool" or is_float(lower):
        return promote_types(higher, lower)
    return higher


def result_type(tensors: list[tuple[str, int]], scalars: Sequence[Any] = ()) -> str:
    """Torch's result type of an op over tensors ``(dtype, rank)`` and Python scalars:
    dimensioned tensors decide, zero-dim tensors and then scalars only lift the result to a
    higher category (bool < integer < floating)."""

    def promote_all(dts: list[str]) -> str | None:
        out = None
        for d in dts:
            out = d if out is None else promote_types(out, d)
        return out

    dims = promote_all([d for d, r in tensors if r > 0])
    zeros = promote_all([d for d, r in tensors if r == 0])
    wrapped = promote_all([scalar_dtype(v) for v in scalars])
    return _combine(dims, _combine(zeros, wrapped)) or "float32"


def compute_dtype(dtype: str) -> str:
    """The dtype arithmetic runs in: half types compute in float32, like Inductor does."""
    return "float32" if dtype in ("float16", "bfloat16") else dtype
