"""The loop IR: buffers, and the closed set of loop node kinds.

Node kinds (this docstring is their spec):

* ``input``     — :class:`InputBufferNode`: a graph input, already in memory (any strides).
* ``pointwise`` — :class:`ComputeNode` whose body stores one value per point of ``i`` vars.
* ``reduction`` — :class:`ComputeNode` whose body reduces over ``r`` vars (``ops.reduction``)
  and stores with ``ops.store_reduction`` at an index over the ``i`` vars only; pointwise ops
  before the reduction are its prologue, ops after it (on the reduced value) its epilogue.
* ``extern``    — :class:`ExternNode`: a call into a library kernel (``aten::mm.default``...).
* ``fallback``  — :class:`ExternNode` with ``kind == "fallback"``: an aten op without a
  lowering, called as is so that every program runs.
* ``output``    — :class:`OutputBufferNode`: the buffers (or Python scalars) the program returns.

A :class:`Buffer` is a named tensor in memory: dtype, device, size, strides (sympy expressions).
Computed buffers are contiguous, or channels-last around 2-D convolutions, or contiguous with
padded row strides where ``config.pad_strides`` asks for aligned rows (:mod:`fireclay_loops.layout`);
inputs keep the strides they arrive with. A buffer is written by one node, except one grown into a
zero-padded matmul operand (:func:`fireclay_loops.lowering.matmul.padded_in_place`): its
producer's nodes write the tensor, and one more node the pad's zeros beside it (its size is the
grown one; the tensor's readers keep their views). Readers wait for every writer.

``meta`` keys on nodes: ``origins`` (the aten ops lowered into it, ``"%v3 = aten::add.Tensor"``),
``source`` (the user's code, copied from the aten node).
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import sympy

from fireclay_ir import InputSpec, Weight
from fireclay_loops import exprs
from fireclay_loops.body import LoopBody
from fireclay_loops.dtypes import ITEMSIZE


@dataclass
class Buffer:
    name: str
    dtype: str
    device: str
    size: list[sympy.Expr]
    stride: list[sympy.Expr]
    offset: sympy.Expr = sympy.Integer(0)
    is_input: bool = False

    def __post_init__(self) -> None:
        self.size = [exprs.as_expr(s) for s in self.size]
        self.stride = [exprs.as_expr(s) for s in self.stride]
        self.offset = exprs.as_expr(self.offset)

    @property
    def numel(self) -> sympy.Expr:
        return exprs.product(self.size)

    @property
    def storage_numel(self) -> sympy.Expr:
        """Elements of storage the buffer spans (offset included)."""
        return _storage_numel(tuple(self.size), tuple(self.stride), self.offset)

    @property
    def itemsize(self) -> int:
        return ITEMSIZE[self.dtype]

    @property
    def nbytes(self) -> sympy.Expr:
        return self.storage_numel * self.itemsize


@functools.lru_cache(maxsize=4096)
def _storage_numel(size: Sequence[Any], stride: Sequence[Any], offset: sympy.Expr) -> sympy.Expr:
    # Asked for every buffer by every pass that weighs memory; buffers share few layouts.
    extent = offset + 1
    for s, st in zip(size, stride):
        extent = extent + (s - 1) * st
    return sympy.Integer(0) if any(s == 0 for s in size) else sympy.expand(extent)


@dataclass(frozen=True)
class TensorArg:
    """A strided view of a buffer, as an extern call receives it (no copy)."""

    buffer: str
    size: tuple[Any, ...]
    stride: tuple[Any, ...]
    offset: Any = sympy.Integer(0)


class LoopNode:
    kind: str = ""

    def __init__(self, name: str, meta: dict[str, Any] | None = None):
        self.name = name
        self.meta: dict[str, Any] = dict(meta or {})

    def read_buffers(self) -> list[str]:
        return []

    def write_buffers(self) -> list[str]:
        return []

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.name} ({self.kind})>"


class InputBufferNode(LoopNode):
    kind = "input"

    def __init__(self, name: str, buffer: str, position: int):
        super().__init__(name)
        self.buffer = buffer
        self.position = position

    def write_buffers(self) -> list[str]:
        return [self.buffer]


class ComputeNode(LoopNode):
    """A pointwise or reduction node: one loop nest running ``body``."""

    def __init__(self, name: str, body: LoopBody, meta: dict[str, Any] | None = None):
        super().__init__(name, meta)
        self.body = body
        self.kind = "reduction" if body.is_reduction else "pointwise"

    def read_buffers(self) -> list[str]:
        return list(dict.fromkeys(b for b, _, _ in self.body.reads()))

    def write_buffers(self) -> list[str]:
        return list(dict.fromkeys(b for b, _, _ in self.body.writes()))


class ExternNode(LoopNode):
    """``outputs = op(*args, **kwargs)`` with tensor arguments as :class:`TensorArg` views.

    ``outputs`` names the buffers the call writes; ``positions`` says which result of the op
    each one receives. It is None when result ``k`` goes to ``outputs[k]`` for every result; it
    is given when some results are undefined (None) and get no buffer, as the input gradient of
    ``convolution_backward`` with ``output_mask=[False, True, True]``."""

    def __init__(self, name: str, op: str, args: tuple[Any, ...], kwargs: dict[str, Any], outputs: list[str],
                 kind: str = "extern", meta: dict[str, Any] | None = None, positions: list[int] | None = None):
        super().__init__(name, meta)
        self.op = op
        self.args = args
        self.kwargs = kwargs
        self.outputs = outputs
        self.kind = kind
        if positions is not None and list(positions) == list(range(len(outputs))):
            positions = None  # the common layout is kept implicit
        if positions is not None and len(positions) != len(outputs):
            raise ValueError(f"extern call {name}: {len(positions)} result positions for {len(outputs)} outputs")
        self.positions = None if positions is None else list(positions)

    def result_positions(self) -> list[int]:
        """The op's result index that each buffer of ``outputs`` receives."""
        return list(range(len(self.outputs))) if self.positions is None else list(self.positions)

    def tensor_args(self) -> list[TensorArg]:
        found: list[TensorArg] = []

        def walk(a: Any) -> None:
            if isinstance(a, TensorArg):
                found.append(a)
            elif isinstance(a, (list, tuple)):
                for x in a:
                    walk(x)
            elif isinstance(a, dict):
                for x in a.values():
                    walk(x)

        walk(self.args)
        walk(self.kwargs)
        return found

    def read_buffers(self) -> list[str]:
        return list(dict.fromkeys(t.buffer for t in self.tensor_args()))

    def write_buffers(self) -> list[str]:
        return list(self.outputs)


class OutputBufferNode(LoopNode):
    kind = "output"

    def __init__(self, name: str, outputs: list[Any]):
        super().__init__(name)
        self.outputs = outputs  # buffer names (str) or Python scalars wrapped in Constant

    def read_buffers(self) -> list[str]:
        return [o for o in self.outputs if isinstance(o, str)]


@dataclass(frozen=True)
class Constant:
    """A scalar the program returns: a Python number, or a sympy expression over size symbols
    (``sym_size`` of a dynamic dimension) evaluated when the program runs."""

    value: Any


@dataclass
class LoopProgram:
    """The lowered, not yet scheduled, program: buffers and nodes in program order."""

    buffers: dict[str, Buffer] = field(default_factory=dict)
    nodes: list[LoopNode] = field(default_factory=list)
    inputs: list[str] = field(default_factory=list)
    symbols: dict[str, int | None] = field(default_factory=dict)  # size symbol -> hint
    seed: int = 0
    donated: set[str] = field(default_factory=set)  # input buffers whose memory may be reused
    # What the source program said of its inputs: parameter/buffer/constant inputs keep their
    # InputSpec (by input buffer name; user inputs are left out), and the weights they name.
    input_specs: dict[str, InputSpec] = field(default_factory=dict)
    weights: dict[str, Weight] = field(default_factory=dict)

    @property
    def output_node(self) -> OutputBufferNode:
        for n in reversed(self.nodes):  # it is the last node
            if isinstance(n, OutputBufferNode):
                return n
        raise ValueError("loop program has no output node")

    @property
    def outputs(self) -> list[Any]:
        return self.output_node.outputs

    def output_buffers(self) -> set[str]:
        return {o for o in self.outputs if isinstance(o, str)}

    def hint(self, e: Any) -> int:
        return exprs.hint(e, {k: v for k, v in self.symbols.items() if v is not None})
