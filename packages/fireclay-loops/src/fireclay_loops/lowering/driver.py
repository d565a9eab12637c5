"""Lowering an aten-dialect Program to a :class:`~fireclay_loops.ir.LoopProgram`: :func:`lower`.

Every aten node goes through its rule in the lowering table (:func:`lowering_for`; importing
this module imports every rule module, whose registrations fill :mod:`.registry`); views become
index arithmetic, pointwise ops and reductions become one loop node each (the scheduler fuses
them later), and ops without a rule become fallback nodes (:mod:`.context` holds the state of
one lowering, which the rules build on).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import sympy

from fireclay_ir import Program, ScalarType, TensorMeta, Value
from fireclay_loops import dtypes, exprs, layout
from fireclay_loops.config import config
from fireclay_loops.errors import LoweringError
from fireclay_loops.ir import Buffer, Constant, ExternNode, InputBufferNode, LoopProgram, OutputBufferNode
from fireclay_loops.lowering import (  # noqa: F401  (importing registers the rules)
    extern,
    indexing,
    matmul,
    pointwise,
    pooling,
    reductions,
    scatters,
    views,
)
from fireclay_loops.lowering.context import SAVED_OUTPUTS, LoweringContext, _values_in, convert_arg, fallback
from fireclay_loops.lowering.registry import LOWERINGS
from fireclay_loops.lowering.values import BufferValue, GeneratedValue, TensorValue


def lowering_for(target: str) -> Callable[..., Any] | None:
    """The rule that lowers ``aten::<target>``, or None (the op becomes a fallback node)."""
    return LOWERINGS.get(target)


def _touches_complex(node: Any) -> bool:
    """Whether a tensor the node reads or writes is complex: loop bodies cannot compute such
    values, so the op (views of complex tensors too) is a library call."""
    values = _values_in(node.args) + _values_in(list(node.kwargs.values())) + list(node.outputs)
    return any(v.is_tensor and dtypes.is_complex(v.meta.dtype) for v in values)


def _device_kind(v: Value) -> str | None:
    return str(v.type.device).split(":")[0] if isinstance(v.type, TensorMeta) else None


def accelerator(program: Program) -> str | None:
    """The device kind ("cuda") other than the CPU that the program's tensors live on, from every
    tensor its entry graph takes or makes (a graph may take only CPU tensors and make CUDA ones),
    or None when all are on the CPU (or meta)."""
    graph = program.main
    kinds = {_device_kind(v) for v in graph.inputs} | {_device_kind(o) for n in graph.nodes for o in n.outputs}
    others = sorted(k for k in kinds if k not in (None, "cpu", "meta"))
    return others[0] if others else None


def _off_device(node: Any, on: str | None) -> bool:
    """Whether a node of a graph on the accelerator ``on`` reads or makes a CPU tensor: a CPU scalar tensor
    in arithmetic with device tensors (eager allows it), or a value computed on the CPU. A kernel
    runs on one device and must not touch the other's memory, so such a node is a library call."""
    if on is None:
        return False
    values = [v for v in _values_in(node.args) + _values_in(list(node.kwargs.values())) + list(node.outputs)
              if v.is_tensor]
    return any(_device_kind(v) == "cpu" for v in values)


def lower(program: Program, *, seed: int = 0, donated: Sequence[int] = (),
          channels_last: bool | None = None) -> LoopProgram:
    """Lower the entry graph of an aten-dialect program. ``donated`` lists positions of inputs
    whose memory the program may reuse once they are dead. ``channels_last`` keeps 4-D
    activations channels-last (:mod:`fireclay_loops.layout`); None decides by
    ``config.channels_last`` and whether the program has 2-D convolutions."""
    ctx = LoweringContext(program, seed, channels_last)
    graph = ctx.graph
    # Memory of one device can only be reused for buffers of that device: a program on a GPU
    # that takes CPU index tensors (eager allows them) must not hand their memory to kernels.
    devices = {v.meta.device.split(":")[0] for v in graph.inputs if not isinstance(v.type, ScalarType)}
    foreign = {"cpu"} if devices - {"cpu", "meta"} else set()
    for pos, v in enumerate(graph.inputs):
        if isinstance(v.type, ScalarType):
            raise LoweringError(f"scalar graph input %{v.name} is not supported yet; pass sizes as symbols")
        t: TensorMeta = v.meta
        size = [exprs.as_expr(d) for d in t.shape]
        stride = [exprs.as_expr(s) for s in t.strides] if t.strides is not None else exprs.contiguous_strides(size)
        buf = Buffer(f"in_{v.name}", t.dtype, t.device, size, stride, t.storage_offset, is_input=True)
        ctx.out.buffers[buf.name] = buf
        ctx.out.inputs.append(buf.name)
        ctx.out.nodes.append(InputBufferNode(f"input_{v.name}", buf.name, pos))
        ctx.env[v] = BufferValue(buf)
        if pos in donated and t.device.split(":")[0] not in foreign:
            ctx.out.donated.add(buf.name)
        spec = graph.input_specs[pos]
        if spec.kind != "user":
            ctx.out.input_specs[buf.name] = spec
    ctx.out.weights = dict(program.weights)
    on = accelerator(program)
    for node in graph.nodes:
        ctx.node = node
        if node.dialect != "aten":
            raise LoweringError(f"fireclay-loops lowers aten-dialect programs; got {node.op}", node)
        args = convert_arg(ctx, node.args)
        kwargs = {k: convert_arg(ctx, v) for k, v in node.kwargs.items()}
        rule = None if _touches_complex(node) or _off_device(node, on) else lowering_for(node.target)
        result = rule(ctx, *args, **kwargs) if rule is not None else fallback(ctx)
        results = list(result) if isinstance(result, (tuple, list)) else [result]
        if len(results) != len(node.outputs):
            raise LoweringError(f"lowering of {node.op} gave {len(results)} results for "
                                f"{len(node.outputs)} outputs", node)
        for out, r in zip(node.outputs, results):
            ctx.env[out] = _stored_if_long(ctx, r)
    ctx.node = None
    outputs: list[Any] = []
    # Outputs only a backward reads keep the layout they were computed in (see SAVED_OUTPUTS).
    saved = set(graph.meta.get(SAVED_OUTPUTS, ()))
    free = saved if ctx.channels_last else set()
    for pos, o in enumerate(graph.outputs):
        v = convert_arg(ctx, o)
        if isinstance(v, TensorValue):
            want = _output_strides(o, v) if ctx.channels_last and pos not in free else None
            if want is None and pos not in saved and isinstance(v, BufferValue) and v.buffer.name in ctx.padded:
                # padded rows never reach the caller (the lowering pads no value returned as it
                # is; this keeps that so for any other path)
                want = _output_strides(o, v)
            if isinstance(v, BufferValue) and v.is_whole_buffer() and (
                    want is None or _same_layout(v, want, exact=v.buffer.name in ctx.library_channels_last)):
                outputs.append(v.buffer.name)
            elif isinstance(v, BufferValue) and _reshaped_library_result(ctx, v, want, outputs):
                # the library result is returned in the output's shape (no copy kernel)
                v.buffer.size, v.buffer.stride = list(v.size), list(v.stride)
                outputs.append(v.buffer.name)
            elif isinstance(v, BufferValue) and want is not None and _restrided_library_result(ctx, v, want, outputs):
                # the same memory as eager's layout: declared in eager's strides (the wrapper
                # restrides the library's tensor, no copy kernel)
                v.buffer.stride = list(want)
                ctx.library_channels_last.discard(v.buffer.name)
                outputs.append(v.buffer.name)
            elif pos in free and layout.can_be_channels_last(v.size):
                # computed here for the backward, whose activations are channels-last too
                outputs.append(ctx.pointwise(v.size, v.dtype, v.device, v.load,
                                             stride=layout.channels_last_strides(v.size)).buffer.name)
            elif want is not None:
                outputs.append(ctx.pointwise(v.size, v.dtype, v.device, v.load, stride=want).buffer.name)
            else:
                outputs.append(ctx.realize(_as_contiguous_copy(v)).buffer.name)
        elif isinstance(v, sympy.Basic):
            outputs.append(Constant(int(v) if v.is_Integer else v))
        else:
            outputs.append(Constant(v))
    ctx.out.nodes.append(OutputBufferNode("output", outputs))
    return ctx.out


def _stored_if_long(ctx: LoweringContext, value: Any) -> Any:
    """``value``, stored into a buffer when it is a lazily computed value whose loads exceed
    ``config.max_lazy_loads``. Each consumer records a lazy value's loads again, and a chain of
    scatters into views of one tensor (the functionalized form of ``attn[..., i, :i] = row`` in a
    loop over rows) reads the previous link twice: left lazy, the i-th link's body would record
    2**i loads. Stored past the limit, a chain of N updates lowers in work linear in N."""
    if isinstance(value, GeneratedValue) and value.loads > config.max_lazy_loads:
        return ctx.realize(value)
    return value


def _output_strides(o: Any, v: TensorValue) -> list[sympy.Expr]:
    """The layout a program output is returned in when the lowering chose layouts itself:
    channels-last where eager's (the output metadata's) is, otherwise contiguous."""
    meta = o.meta if isinstance(o, Value) and o.is_tensor else None
    if meta is not None and meta.strides is not None and layout.is_channels_last(meta.shape, meta.strides):
        return layout.channels_last_strides(v.size)
    return exprs.contiguous_strides(v.size)


def _reshaped_library_result(ctx: LoweringContext, v: BufferValue, want: Sequence[Any] | None,
                             outputs: list[Any]) -> bool:
    """Whether output ``v`` is another shape of one library call's whole contiguous result (a
    language model's logits: ``mm`` over [tokens, vocab] returned as [batch, seq, vocab]). Such a
    result can be declared in the output's shape and taken as returned, instead of copied by a
    kernel; kernels index buffers by storage offset and library calls by their own views, so no
    reader depends on the buffer's declared shape."""
    buf = v.buffer
    if buf.is_input or buf.name in outputs or not exprs.equal(buf.offset, 0) or not exprs.equal(v.offset, 0):
        return False
    contiguous = exprs.contiguous_strides(v.size)
    if not v.is_contiguous() or not _same_layout(BufferValue(buf), exprs.contiguous_strides(buf.size)):
        return False
    if want is not None and not all(exprs.equal(a, b) or exprs.equal(n, 1) for n, a, b in zip(v.size, contiguous, want)):
        return False
    if not exprs.equal(exprs.product(v.size), buf.numel):
        return False
    writers = [n for n in ctx.out.nodes if buf.name in n.write_buffers()]
    return len(writers) == 1 and isinstance(writers[0], ExternNode) and len(writers[0].outputs) == 1


def _restrided_library_result(ctx: LoweringContext, v: BufferValue, want: Sequence[Any], outputs: list[Any]) -> bool:
    """Whether output ``v`` is a library call's whole channels-last result of one channel or one
    pixel (a 1 x 1 convolution's weight gradient): the same memory as eager's layout, with other
    strides only along dimensions of extent 1. Declared in eager's strides, it is returned as the
    library wrote it; kernels that read it index dimensions of extent 1 at 0 only."""
    if not v.is_whole_buffer():
        return False
    buf = v.buffer
    if buf.is_input or buf.name in outputs or buf.name not in ctx.library_channels_last:
        return False
    return _same_layout(v, want)


def _same_layout(v: BufferValue, stride: Sequence[Any], exact: bool = False) -> bool:
    """Whether ``v`` has ``stride``; along dimensions of extent 1 too if ``exact`` (a library's
    channels-last result of one channel or pixel reports other strides there than eager's)."""
    return all(exprs.equal(a, b) or (not exact and exprs.equal(n, 1)) for n, a, b in zip(v.size, v.stride, stride))


def _as_contiguous_copy(v: TensorValue) -> TensorValue:
    # A view that is returned gets its own buffer: outputs never alias other buffers' storage.
    if isinstance(v, BufferValue):
        return GeneratedValue(v.size, v.dtype, v.device, v.load, reads=[v])
    return v


__all__ = ["lower", "lowering_for"]
