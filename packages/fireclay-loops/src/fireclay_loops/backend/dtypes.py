"""What a code generator needs to know of the loop IR's dtypes and index widths, whatever the
target spells them as: which are floating point, a constant as float32 holds it, the extremes of
each dtype (where a max or min reduction starts), and whether a kernel's offsets fit 32 bits."""

from __future__ import annotations

import math
import struct
from collections.abc import Callable

import sympy

from fireclay_loops.kernel import Kernel

FLOAT_DTYPES = ("float64", "float32", "float16", "bfloat16")
INT_BITS = {"int64": 64, "int32": 32, "int16": 16, "int8": 8}
INT32_LIMIT = 2**31 - 1


def is_float(dtype: str) -> bool:
    return dtype in FLOAT_DTYPES


def as_float32(v: float) -> float:
    """``v`` rounded to the nearest float32 (as a cast to float rounds it); a finite value
    beyond float32's range is left to the cast."""
    try:
        rounded: float = struct.unpack("f", struct.pack("f", v))[0]
    except OverflowError:
        return v
    return v if math.isinf(rounded) and not math.isinf(v) else rounded


def extreme(dtype: str, largest: bool) -> float | int:
    """The largest (or smallest) value of ``dtype``: infinity for floating point, where the max
    and min reductions start from the other end."""
    if is_float(dtype):
        return math.inf if largest else -math.inf
    if dtype == "bool":
        return 1 if largest else 0
    bits = INT_BITS.get(dtype)
    if bits is None:  # uint8
        return 255 if largest else 0
    return (1 << (bits - 1)) - 1 if largest else -(1 << (bits - 1))


def needs_index64(kernel: Kernel, storage_numel: Callable[[str], sympy.Expr]) -> bool:
    """Whether the kernel needs 64-bit indices: some size is symbolic, or an offset may pass
    2**31 - 1 (``storage_numel(buffer)``: the elements a buffer spans)."""
    extents = [kernel.numel * kernel.rnumel]
    for kn in kernel.nodes:
        for b, _, _ in kn.reads() + kn.writes():
            if b not in kernel.internal:
                extents.append(storage_numel(b))
    return any(not sympy.sympify(e).is_Integer or int(e) >= INT32_LIMIT for e in extents)
