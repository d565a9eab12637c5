"""What an aten tensor becomes during lowering: something that can be loaded at an index.

* :class:`BufferValue` — a strided view of a buffer (offset + sum of index * stride);
* :class:`MappedValue` — another value read through an index map (views strides cannot express,
  such as reshaping a transposed tensor);
* :class:`GeneratedValue` — computed from the index alone (constants, :class:`ConstantValue`,
  iota, random numbers)
  or from other values at other indices (gathers, concatenations, scatters of views), recorded
  again by each consumer's load and never stored unless a consumer needs memory or
  :attr:`~TensorValue.loads` grows past ``config.max_lazy_loads`` (the lowering then stores it).

Views are index arithmetic: :func:`view` composes an index map with a value and, when the
result is still affine over a buffer, folds it back into a :class:`BufferValue`.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import sympy

from fireclay_loops import exprs
from fireclay_loops.ir import Buffer
from fireclay_loops.ops import ops

Index = list[Any]  # a list of sympy expressions, one per dimension


class TensorValue:
    # Memory loads one ``load`` of this value records: a lazily computed value repeats its
    # operands' loads in every consumer, and a chain of scatters into views of one tensor
    # (functionalized in-place row updates) reads the chain twice per link.
    loads: int = 1

    def __init__(self, size: Sequence[Any], dtype: str, device: str):
        self.size = [exprs.as_expr(s) for s in size]
        self.dtype = dtype
        self.device = device

    @property
    def rank(self) -> int:
        return len(self.size)

    def load(self, index: Index, mask: Any = None) -> Any:
        raise NotImplementedError


class BufferValue(TensorValue):
    def __init__(self, buffer: Buffer, size: Sequence[Any] | None = None, stride: Sequence[Any] | None = None,
                 offset: Any = None):
        super().__init__(buffer.size if size is None else size, buffer.dtype, buffer.device)
        self.buffer = buffer
        self.stride = [exprs.as_expr(s) for s in (buffer.stride if stride is None else stride)]
        self.offset = exprs.as_expr(buffer.offset if offset is None else offset)

    def flat_index(self, index: Index) -> sympy.Expr:
        out = self.offset
        for i, s in zip(index, self.stride):
            out = out + sympy.Mul(exprs.as_expr(i), s)
        return out

    def load(self, index: Index, mask: Any = None) -> Any:
        if mask is None:
            return ops.load(self.buffer.name, self.flat_index(index))
        return ops.masked_load(self.buffer.name, self.flat_index(index), mask)

    def is_whole_buffer(self) -> bool:
        b = self.buffer
        return (len(self.size) == len(b.size) and all(exprs.equal(x, y) for x, y in zip(self.size, b.size))
                and all(exprs.equal(x, y) or exprs.equal(n, 1) for x, y, n in zip(self.stride, b.stride, self.size))
                and exprs.equal(self.offset, b.offset))

    def is_contiguous(self) -> bool:
        want = exprs.contiguous_strides(self.size)
        return all(exprs.equal(s, w) or exprs.equal(n, 1) for s, w, n in zip(self.stride, want, self.size))


class MappedValue(TensorValue):
    def __init__(self, base: TensorValue, size: Sequence[Any], index_map: Callable[[Index], Index]):
        super().__init__(size, base.dtype, base.device)
        self.base = base
        self.index_map = index_map
        self.loads = base.loads

    def load(self, index: Index, mask: Any = None) -> Any:
        return self.base.load(self.index_map(index), mask)


class GeneratedValue(TensorValue):
    """``fn(index, mask)`` computes the value; any load it makes must honour ``mask`` (points
    where the mask is false may lie outside every buffer). ``reads``: the values ``fn`` loads,
    once each per call (listed twice if loaded twice), for :attr:`loads`."""

    def __init__(self, size: Sequence[Any], dtype: str, device: str, fn: Callable[[Index, Any], Any],
                 reads: Sequence[Any] = ()):
        super().__init__(size, dtype, device)
        self.fn = fn
        self.loads = loads_of(reads)

    def load(self, index: Index, mask: Any = None) -> Any:
        return self.fn(index, mask)


class ConstantValue(GeneratedValue):
    """One ``value`` at every index (``zeros``, ``full``): a lowering may ask for it (a
    scatter-add into zeros is its sum alone)."""

    def __init__(self, value: Any, size: Sequence[Any], dtype: str, device: str):
        def constant(idx: Index, mask: Any = None) -> Any:
            return ops.constant(value, dtype)

        super().__init__(size, dtype, device, constant)
        self.value = value


def _probe_vars(n: int) -> list[sympy.Symbol]:
    return [exprs.symbol(f"_p{k}") for k in range(n)]


def view(value: TensorValue, size: Sequence[Any], index_map: Callable[[Index], Index]) -> TensorValue:
    """``value`` seen through ``index_map`` (new index -> old index) with a new ``size``."""
    size = [exprs.as_expr(s) for s in size]
    if isinstance(value, BufferValue):
        probe = _probe_vars(len(size))
        flat = sympy.expand(value.flat_index(index_map(list(probe))))
        affine = _affine(flat, probe)
        if affine is not None:
            offset, strides = affine
            return BufferValue(value.buffer, size, strides, offset)
    if isinstance(value, MappedValue):
        inner = value.index_map
        return MappedValue(value.base, size, lambda idx: inner(index_map(idx)))
    if isinstance(value, GeneratedValue):
        fn = value.fn
        def load(idx: Index, mask: Any = None) -> Any:
            return fn(index_map(idx), mask)

        return GeneratedValue(size, value.dtype, value.device, load, reads=[value])
    return MappedValue(value, size, index_map)


def permuted(value: TensorValue, dims: Sequence[int]) -> TensorValue:
    """``value`` with its dimensions in the order ``dims``. A buffer of static strides and offset
    needs no algebra: its strides trade places (what :func:`view` finds by expanding the index)."""
    if isinstance(value, BufferValue) and value.offset.is_Integer and all(s.is_Integer for s in value.stride):
        return BufferValue(value.buffer, [value.size[d] for d in dims], [value.stride[d] for d in dims], value.offset)

    def index_map(idx: Index) -> Index:
        old: list[Any] = [None] * value.rank
        for k, d in enumerate(dims):
            old[d] = idx[k]
        return old

    return view(value, [value.size[d] for d in dims], index_map)


def loads_of(values: Sequence[Any]) -> int:
    """Memory loads that loading each tensor value of ``values`` once records (scalars and
    None count nothing)."""
    return sum(v.loads for v in values if isinstance(v, TensorValue))


def _affine(flat: sympy.Expr, probe: list[sympy.Symbol]) -> tuple[sympy.Expr, list[sympy.Expr]] | None:
    """``(offset, strides)`` when ``flat`` is affine in the probe variables, else None."""
    if any(f.has(*probe) for f in flat.atoms(exprs.FloorDiv, exprs.Mod)):
        return None
    strides = []
    rest = flat
    for p in probe:
        c = flat.coeff(p)
        if c.has(*probe):
            return None
        strides.append(c)
        rest = rest - c * p
    rest = sympy.expand(rest)
    if rest.has(*probe):
        return None
    return rest, strides


def broadcast_index(value: TensorValue, index: Index, out_size: Sequence[Any]) -> Index:
    """The index into ``value`` that numpy-style broadcasting to ``out_size`` reads."""
    lead = len(out_size) - value.rank
    return [sympy.Integer(0) if exprs.equal(value.size[k], 1) else index[lead + k] for k in range(value.rank)]


def load_broadcast(value: TensorValue, index: Index, out_size: Sequence[Any], mask: Any = None) -> Any:
    return value.load(broadcast_index(value, index, out_size), mask)
