"""The state of one lowering (:class:`LoweringContext`) and the helpers the rules build on.

:func:`~fireclay_loops.lowering.driver.lower` runs a lowering: every aten node goes through its
rule (see :mod:`.registry`); views become index arithmetic, pointwise ops and reductions become
one loop node each (the scheduler fuses them later), and ops without a rule become fallback
nodes (:func:`fallback`).
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Sequence
from typing import Any

import sympy

from fireclay_ir import Device, DType, Program, ScalarType, SymExpr, Value
from fireclay_loops import dtypes, exprs, layout
from fireclay_loops.body import record_body
from fireclay_loops.config import config
from fireclay_loops.dtypes import ITEMSIZE
from fireclay_loops.errors import LoweringError
from fireclay_loops.ir import (
    Buffer,
    ComputeNode,
    ExternNode,
    LoopProgram,
    TensorArg,
)
from fireclay_loops.lowering import library_layouts
from fireclay_loops.lowering.values import BufferValue, ConstantValue, TensorValue
from fireclay_loops.ops import ops

# Graph meta key: positions of outputs that only the program's backward reads (set by
# fireclay-autograd on a forward graph). Their layout is the lowering's choice: the backward is
# compiled for the layouts it receives.
SAVED_OUTPUTS = layout.SAVED_OUTPUTS

# The pointwise op that combines two partial results of each reduction kind an unrolled reduction
# computes (the others, argmax and Welford's, carry more than one value).
_COMBINE = {"sum": "add", "prod": "mul", "max": "maximum", "min": "minimum", "any": "logical_or", "all": "logical_and"}


def _contiguous_along(body: Any, rvars: Sequence[Any]) -> bool:
    """Whether some memory read of ``body`` steps by one element along one of ``rvars``."""
    return any(sympy.expand(index).coeff(v) == 1 for _, index, _ in body.reads() for v in rvars)


class LoweringContext:
    """State of one lowering: the loop program being built and what each aten value became."""

    def __init__(self, program: Program, seed: int = 0, channels_last: bool | None = None):
        self.source = program
        self.graph = program.main
        self.out = LoopProgram(symbols={n: s.hint for n, s in program.symbols.items()}, seed=seed)
        self.env: dict[Value, Any] = {}
        self.node: Any = None  # the aten node being lowered
        self._counts: dict[str, int] = {}
        self.random_offset: sympy.Expr = sympy.Integer(0)
        # Keep 4-D activations channels-last (see fireclay_loops.layout)?
        self.channels_last = (layout.uses_channels_last(self.graph, config.channels_last)
                              if channels_last is None else channels_last)
        self._reads_cl: dict[int, bool] = {}  # id(aten node) -> whether it reads a channels-last buffer
        self.library_channels_last: set[str] = set()  # library results planned channels-last
        self._returned: set[Value] | None = None
        self.padded: set[str] = set()  # buffers laid out with padded rows (layout.padded_strides)
        self._eager_layout_values: set[Value] | None = None
        # buffers grown in place into a padded matmul operand (lowering.matmul): their sizes before
        self.grown: dict[str, list[sympy.Expr]] = {}

    # -- naming
    def fresh(self, prefix: str) -> str:
        k = self._counts.get(prefix, 0)
        self._counts[prefix] = k + 1
        return f"{prefix}{k}"

    def buffer_dtype(self, name: str) -> str:
        return self.out.buffers[name].dtype

    def new_buffer(self, size: Sequence[Any], dtype: str, device: str, stride: Sequence[Any] | None = None) -> Buffer:
        """A buffer for the current node; with ``stride`` None, laid out by :meth:`layout_strides`
        and, where the node's result may take it, with padded rows (:meth:`_padded`)."""
        padded = None
        if stride is None:
            stride = self.layout_strides(size)
            padded = self._padded(size, stride, dtype, device)
        buf = Buffer(self.fresh("buf"), dtype, device, list(size), list(padded or stride))
        self.out.buffers[buf.name] = buf
        if padded is not None:
            self.padded.add(buf.name)
        return buf

    # -- layout
    def _padded(self, size: Sequence[Any], stride: Sequence[Any], dtype: str, device: str) -> list[sympy.Expr] | None:
        """Padded strides (:func:`layout.padded_strides`) for the current node's result, when its
        device type is in ``config.pad_strides`` and nothing reads its memory as eager lays it
        out: no result of the node is returned to the caller (through views; a saved output, which
        only the backward reads, may be padded) or read by ``as_strided``."""
        if self.node is None or str(device).split(":")[0] not in config.pad_strides:
            return None
        padded = layout.padded_strides(size, stride, ITEMSIZE[dtype], config.pad_min_stride)
        if padded is None:
            return None
        return None if self.needs_eager_layout() else padded

    def needs_eager_layout(self) -> bool:
        """Whether some result of the current node must be stored in eager's layout: it is
        returned to the caller (through views) or read by ``as_strided``."""
        if self._eager_layout_values is None:
            self._eager_layout_values = _values_needing_eager_layout(self.graph, self._returned_values())
        return any(o in self._eager_layout_values for o in self.node.outputs)

    def layout_strides(self, size: Sequence[Any]) -> list[sympy.Expr]:
        """Strides of a new buffer of ``size`` computed for the current node: channels-last when
        the program keeps activations so and the node reads a channels-last buffer; else
        contiguous."""
        if self.channels_last and layout.can_be_channels_last(size) and self._node_reads_channels_last():
            return layout.channels_last_strides(size)
        order = self._input_order(size)
        if order is not None:
            return library_layouts.strides_in_order(size, order)
        return exprs.contiguous_strides(size)

    def _input_order(self, size: Sequence[Any]) -> list[int] | None:
        """The dimension order (outermost first) of the first buffer of ``size`` the current
        node reads, when that buffer is dense in another order than the contiguous one with its
        last dimension innermost; None otherwise. Eager's elementwise kernels lay their result
        out in their inputs' order: attention heads split off a projection by view + transpose
        stay in (batch, sequence, heads, dim) order through a rotary embedding, so the fused
        attention kernel, which writes its output in its query's order, gives one that the
        output projection reads as a view. Only orders that keep the last dimension innermost
        are followed: the store of the innermost loop stays dense (channels-last activations
        are :mod:`fireclay_loops.layout`'s choice, with loops in their memory order)."""
        node = self.node
        if node is None or len(size) < 3:
            return None
        for a in _values_in(list(node.args) + list(node.kwargs.values())):
            v = self.env.get(a)
            if not isinstance(v, BufferValue) or len(v.size) != len(size):
                continue
            if not all(exprs.equal(x, y) for x, y in zip(v.size, size)):
                continue
            try:
                known = {n: h for n, h in self.out.symbols.items() if h is not None}
                hints = [exprs.hint(x, known) for x in (*v.size, *v.stride)]
            except KeyError:
                continue
            order = library_layouts.dense_order(hints[:len(size)], hints[len(size):])
            if order is None or order == list(range(len(size))):
                continue
            if order[-1] != len(size) - 1:
                continue
            want = library_layouts.strides_in_order(size, order)
            if all(exprs.equal(x, y) or exprs.equal(n, 1) for n, x, y in zip(size, v.stride, want)):
                return order
        return None

    def _node_reads_channels_last(self) -> bool:
        node = self.node
        if node is None:
            return False
        key = id(node)
        if key not in self._reads_cl:
            found = False
            for a in _values_in(list(node.args) + list(node.kwargs.values())):
                v = self.env.get(a)
                if isinstance(v, BufferValue) and layout.is_channels_last(v.size, v.stride):
                    found = True
                    break
            self._reads_cl[key] = found
        return self._reads_cl[key]

    def arg_in_layout(self, value: TensorValue, channels_last: bool) -> TensorValue:
        """``value`` as a buffer view channels-last or in eager's layout: itself when it is one,
        else a copy."""
        if channels_last:
            stride, already = layout.channels_last_strides(value.size), layout.is_channels_last
        else:
            stride, already = exprs.contiguous_strides(value.size), layout.is_contiguous
        if isinstance(value, BufferValue) and already(value.size, value.stride):
            return value
        return self.pointwise(value.size, value.dtype, value.device, value.load, stride=stride)

    def _meta(self) -> dict[str, Any]:
        node = self.node
        if node is None:
            return {}
        outs = ", ".join(f"%{o.name}" for o in node.outputs)
        meta: dict[str, Any] = {"origins": [f"{outs} = {node.op}"]}
        if node.source:
            meta["source"] = dict(node.source)
        return meta

    # -- what lowerings call
    def check_site(self, what: str) -> str:
        """``what`` a kernel check guards (``dimension 0 of embedding``), with the user's line
        it came from, for the error a failed check raises."""
        src = self.node.source if self.node is not None else None
        if not src:
            return what
        text = str(src.get("text") or "").strip()
        return f"{what} at {src.get('file')}:{src.get('line')}" + (f": {text}" if text else "")

    def checks_on(self, device: str, integer_division: bool = False) -> bool:
        """Whether kernels of ``device`` check what eager raises on (``config.kernel_checks``);
        integer division by zero raises in eager on the CPU only (CUDA gives a value)."""
        if not config.kernel_checks:
            return False
        return not integer_division or str(device).split(":")[0] == "cpu"

    def out_meta(self, i: int = 0) -> tuple[list[sympy.Expr], str, str]:
        t = self.node.outputs[i].meta
        return [exprs.as_expr(d) for d in t.shape], t.dtype, t.device

    def pointwise(self, size: Sequence[Any], dtype: str, device: str,
                  inner: Callable[[list[Any]], Any], stride: Sequence[Any] | None = None) -> BufferValue:
        """A pointwise node computing ``inner(index)`` at every point of ``size``, stored with
        ``stride`` (default: :meth:`layout_strides`); its loops walk the buffer in memory order."""
        size = [exprs.as_expr(s) for s in size]
        buf = self.new_buffer(size, dtype, device, stride)
        loop_dims = layout.loop_order(size, buf.stride)

        def fn(vars: Sequence[Any], _rvars: Sequence[Any]) -> Any:
            index: list[Any] = [sympy.Integer(0)] * len(size)
            for v, k in zip(vars, loop_dims):
                index[k] = v
            value = ops.to_dtype(inner(index), dtype)
            ops.store(buf.name, sum((i * s for i, s in zip(index, buf.stride)), sympy.Integer(0)), value)

        body = record_body([size[k] for k in loop_dims], [], fn, self.buffer_dtype, self.fresh)
        self.out.nodes.append(ComputeNode(self.fresh("op"), body, self._meta()))
        return BufferValue(buf)

    def zero_fill(self, buf: Buffer, starts: Sequence[Any], size: Sequence[Any]) -> None:
        """A pointwise node storing zeros into ``buf`` at the indices ``starts + i`` for every
        ``i`` of ``size`` (positions past the extents of the tensor the buffer's other writers
        compute: a padded matmul operand's pad), placed before the first node that writes
        ``buf``: the scheduler runs every writer of a buffer before its readers."""
        size = [exprs.as_expr(s) for s in size]
        loop_dims = sorted((k for k in range(len(size)) if not exprs.equal(size[k], 1)),
                           key=lambda k: -self.out.hint(buf.stride[k]))  # memory order

        def fn(vars: Sequence[Any], _rvars: Sequence[Any]) -> Any:
            index = [exprs.as_expr(s) for s in starts]
            for v, k in zip(vars, loop_dims):
                index[k] = index[k] + v
            flat = buf.offset + sum((i * s for i, s in zip(index, buf.stride)), sympy.Integer(0))
            ops.store(buf.name, flat, ops.to_dtype(ops.constant(0, dtypes.compute_dtype(buf.dtype)), buf.dtype))

        body = record_body([size[k] for k in loop_dims], [], fn, self.buffer_dtype, self.fresh)
        first = next(k for k, n in enumerate(self.out.nodes) if buf.name in n.write_buffers())
        self.out.nodes.insert(first, ComputeNode(self.fresh("op"), body, self._meta()))

    def scatter_add(self, size: Sequence[Any], dtype: str, device: str, points: Sequence[Any],
                    inner: Callable[[list[Any]], tuple[list[Any], Any]]) -> BufferValue:
        """A new contiguous buffer of ``size`` holding, at each index, the sum of the values
        added there: ``inner(point)`` gives, at each point of ``points`` (in order), the index
        it adds at and the value (``ops.store_add``; the buffer starts at zero)."""
        size = [exprs.as_expr(s) for s in size]
        buf = self.new_buffer(size, dtype, device, exprs.contiguous_strides(size))

        def fn(vars: Sequence[Any], _rvars: Sequence[Any]) -> Any:
            index, value = inner(list(vars))
            flat = sum((i * s for i, s in zip(index, buf.stride)), sympy.Integer(0))
            ops.store_add(buf.name, flat, ops.to_dtype(value, dtype))

        body = record_body(list(points), [], fn, self.buffer_dtype, self.fresh)
        self.out.nodes.append(ComputeNode(self.fresh("op"), body, self._meta()))
        return BufferValue(buf)

    def reduction(self, in_size: Sequence[Any], dims: Sequence[int], keepdim: bool, device: str,
                  reduction_type: str, acc_dtype: str, inner: Callable[[list[Any]], Any],
                  finals: Sequence[tuple[str, Callable[[Any, sympy.Expr], Any]]],
                  src_dtype: str | None = None) -> list[BufferValue]:
        """A reduction node over ``dims`` of ``in_size``; ``inner(index)`` is the value reduced.
        Each ``(dtype, final)`` of ``finals`` stores ``final(acc, rnumel)`` into one output."""
        in_size = [exprs.as_expr(s) for s in in_size]
        n = len(in_size)
        dims = sorted({d % n for d in dims}) if n else []
        xdims = [k for k in range(n) if k not in dims and not exprs.equal(in_size[k], 1)]
        rdims = [k for k in dims if not exprs.equal(in_size[k], 1)]
        kept = [k for k in range(n) if keepdim or k not in dims]
        out_size = [in_size[k] if k not in dims else sympy.Integer(1) for k in kept]
        bufs = [self.new_buffer(out_size, dt, device) for dt, _ in finals]
        rnumel = exprs.product(in_size[k] for k in dims)
        count = exprs.to_static(rnumel)
        unroll = reduction_type in _COMBINE and count is not None and 2 <= count <= config.unroll_reductions

        def fn(vars: Sequence[Any], rvars: Sequence[Any]) -> Any:
            index: list[Any] = [sympy.Integer(0)] * n
            for v, k in zip(vars, xdims):
                index[k] = v
            for v, k in zip(rvars, rdims):
                index[k] = v
            value = inner(index)
            acc = ops.reduction(acc_dtype, src_dtype or acc_dtype, reduction_type, value)
            for buf, (dt, final) in zip(bufs, finals):
                # each output by its own strides: padded rows differ with the dtype's size
                out_index = sum((index[k] * buf.stride[j] for j, k in enumerate(kept) if k not in dims),
                                sympy.Integer(0))
                ops.store_reduction(buf.name, out_index, ops.to_dtype(final(acc, rnumel), dt))

        body = record_body([in_size[k] for k in xdims], [in_size[k] for k in rdims], fn, self.buffer_dtype, self.fresh)
        if unroll and not _contiguous_along(body, body.reduction_vars):
            self._unrolled_reduction(in_size, xdims, rdims, kept, dims, bufs, reduction_type, acc_dtype, inner, finals,
                                     rnumel)
        else:
            self.out.nodes.append(ComputeNode(self.fresh("op"), body, self._meta()))
        return [BufferValue(b) for b in bufs]

    def _unrolled_reduction(self, in_size: list[Any], xdims: list[int], rdims: list[int], kept: list[int],
                            dims: Sequence[int], bufs: list[Buffer], reduction_type: str, acc_dtype: str,
                            inner: Callable[[list[Any]], Any],
                            finals: Sequence[tuple[str, Callable[[Any, sympy.Expr], Any]]], rnumel: sympy.Expr) -> None:
        """A reduction over a few points (``config.unroll_reductions``) that no read walks
        contiguously, as a pointwise node: each point's value is loaded and combined in turn, in
        the reduction's order. The gradient of grouped-query attention's keys sums 3 heads per key
        head; as a reduction each program's tile reads 3 values far apart per output, as pointwise
        code it reads 3 contiguous runs, and the node fuses like any pointwise one. A short row
        (a softmax over 8 keys) stays a reduction: its reads are contiguous already, and its
        consumers fuse with it."""
        combine = _COMBINE[reduction_type]
        points = list(itertools.product(*(range(int(exprs.to_static(in_size[k]))) for k in rdims)))  # type: ignore[arg-type]

        def fn(vars: Sequence[Any], _rvars: Sequence[Any]) -> Any:
            index: list[Any] = [sympy.Integer(0)] * len(in_size)
            for v, k in zip(vars, xdims):
                index[k] = v
            acc = None
            for point in points:
                for r, k in zip(point, rdims):
                    index[k] = sympy.Integer(r)
                value = ops.to_dtype(inner(list(index)), acc_dtype)
                acc = value if acc is None else getattr(ops, combine)(acc, value)
            for buf, (dt, final) in zip(bufs, finals):
                out_index = sum((index[k] * buf.stride[j] for j, k in enumerate(kept) if k not in dims),
                                sympy.Integer(0))
                ops.store(buf.name, out_index, ops.to_dtype(final(acc, rnumel), dt))

        body = record_body([in_size[k] for k in xdims], [], fn, self.buffer_dtype, self.fresh)
        self.out.nodes.append(ComputeNode(self.fresh("op"), body, self._meta()))

    def realize(self, value: TensorValue) -> BufferValue:
        """A value in memory: buffers as they are, anything else computed into a new buffer."""
        if isinstance(value, BufferValue):
            return value
        # (never padded: the current node is the value's reader, whose results say nothing of
        # who else reads this value in eager's layout)
        return self.pointwise(value.size, value.dtype, value.device, value.load, stride=self.layout_strides(value.size))

    def realize_strided(self, value: TensorValue) -> TensorArg:
        v = self.realize(value)
        if any((n := exprs.to_static(s)) is not None and n < 0 for s in v.stride):
            # Library kernels take non-negative strides only (a flipped view is copied).
            v = self.pointwise(v.size, v.dtype, v.device, v.load)
        return TensorArg(v.buffer.name, tuple(v.size), tuple(v.stride), v.offset)

    def extern(self, op: str, args: tuple[Any, ...], kwargs: dict[str, Any], kind: str = "extern",
               sizes: Sequence[Sequence[Any]] | None = None) -> tuple[BufferValue | None, ...]:
        """An extern (or fallback) call writing the current node's tensor outputs. An output
        typed ``ScalarType("opaque")`` is a result the op leaves undefined (None): it gets no
        buffer, and its value in the lowering is None, so a use of it fails loudly. So is a
        scalar result no node reads (fused attention's sequence lengths, which the traced graph
        holds as constants where it needs them). A tensor result of a several-result call that
        nothing reads gets no buffer either: fused attention leaves its log-sum-exp undefined
        when no backward asks for it, though its metadata describes one.

        ``sizes``: the sizes of the call's results when they are not the node's (the call
        computes something larger that the node's results view: a matmul over padded
        operands); such results are intermediate buffers, contiguous as the library writes them."""
        outs: list[Buffer] = []
        positions: list[int] = []
        results: list[BufferValue | None] = []
        follows_cl = self.channels_last and _result_is_channels_last(op, args)
        graph_outputs = set(_values_in(self.node.graph.outputs))
        returned = self._returned_values()
        # the layouts the library returns for these operands' layouts (library_layouts)
        library = [None] * len(self.node.outputs) if sizes is not None else library_layouts.result_strides(
            op, args, kwargs, self.out.buffers, {n: h for n, h in self.out.symbols.items() if h is not None},
            [[exprs.as_expr(d) for d in o.meta.shape] if o.is_tensor else None for o in self.node.outputs])
        for k, o in enumerate(self.node.outputs):
            unread = not o.users and o not in graph_outputs
            if o.is_tensor and len(self.node.outputs) > 1 and unread:
                results.append(None)
                continue
            if not o.is_tensor:
                if isinstance(o.type, ScalarType) and (o.type.kind == "opaque" or unread):
                    results.append(None)
                    continue
                raise LoweringError(f"{op} returns a non-tensor value %{o.name}; it cannot be an extern call",
                                    self.node)
            t = o.meta
            size = [exprs.as_expr(d) for d in (t.shape if sizes is None else sizes[k])]
            stride = [exprs.as_expr(s) for s in t.strides] if t.strides is not None else exprs.contiguous_strides(size)
            written = library[k]
            if sizes is not None:
                stride = exprs.contiguous_strides(size)
            if o not in returned and written is not None:
                # what the library writes for these operands: its readers take it as it is
                # (a program output keeps eager's strides: the metadata's)
                stride = written
            buf = Buffer(self.fresh("buf"), t.dtype, t.device, size, stride)
            if follows_cl and len(size) == 4:
                # as the library writes it (one channel or one pixel included: those strides
                # differ from the contiguous ones only along dimensions of extent 1)
                buf.stride = layout.channels_last_strides(size)
                self.library_channels_last.add(buf.name)
            self.out.buffers[buf.name] = buf
            outs.append(buf)
            positions.append(k)
            results.append(BufferValue(buf))
        self.out.nodes.append(ExternNode(self.fresh("op"), op, args, kwargs, [b.name for b in outs], kind,
                                         self._meta(), positions))
        return tuple(results)

    def library_call(self, op: str, args: tuple[Any, ...], size: Sequence[Any], dtype: str, device: str) -> BufferValue:
        """A library call of ``op`` (one tensor result, written contiguous into a buffer of its
        own) made for the current node without being it: one of the matrix products a
        convolution over a one-pixel image is (:mod:`fireclay_loops.lowering.pixel_convolutions`)."""
        size = [exprs.as_expr(d) for d in size]
        buf = Buffer(self.fresh("buf"), dtype, device, size, exprs.contiguous_strides(size))
        self.out.buffers[buf.name] = buf
        self.out.nodes.append(ExternNode(self.fresh("op"), op, args, {}, [buf.name], "extern", self._meta(), [0]))
        return BufferValue(buf)

    def _returned_values(self) -> set[Value]:
        """The graph's outputs that leave the program in eager's layout: all but those only
        the backward reads (``SAVED_OUTPUTS``: the backward is compiled for the layouts it
        receives)."""
        if self._returned is None:
            graph = self.graph
            saved = set(graph.meta.get(SAVED_OUTPUTS, ()))
            self._returned = {v for pos, o in enumerate(graph.outputs) if pos not in saved for v in _values_in([o])}
        return self._returned

    def constant(self, value: Any, size: Sequence[Any], dtype: str, device: str) -> ConstantValue:
        return ConstantValue(value, size, dtype, device)


def _values_in(items: Any) -> list[Value]:
    """The graph values among (nested lists of) node arguments."""
    found: list[Value] = []
    for a in items:
        if isinstance(a, Value):
            found.append(a)
        elif isinstance(a, (list, tuple)):
            found.extend(_values_in(a))
    return found


def _values_needing_eager_layout(graph: Any, returned: set[Value]) -> set[Value]:
    """The graph's values whose memory must be laid out as eager's: the ``returned`` outputs, the
    values they view (``view`` of a padded buffer to the output would reach its padding), and the
    values ``as_strided`` reads (it addresses memory by eager's strides), with what they view."""
    from fireclay_loops.lowering.views import PURE_VIEW_TARGETS

    pending = list(returned)
    for node in graph.nodes:
        if node.target == "as_strided.default":
            pending.extend(_values_in(node.args[:1]))
    found: set[Value] = set()
    while pending:
        v = pending.pop()
        if v in found:
            continue
        found.add(v)
        producer = v.node
        if producer is not None and producer.target in PURE_VIEW_TARGETS:
            pending.extend(_values_in(producer.args[:1]))
    return found


def _result_is_channels_last(op: str, args: Sequence[Any]) -> bool:
    """Whether a library call writes its 4-D results channels-last: the op follows the layout of
    one argument (:data:`layout.FOLLOWS_INPUT_LAYOUT`), and that argument is a channels-last view."""
    pos = layout.FOLLOWS_INPUT_LAYOUT.get(op)
    if pos is None or pos >= len(args) or not isinstance(args[pos], TensorArg):
        return False
    return layout.is_channels_last(args[pos].size, args[pos].stride)


def convert_arg(ctx: LoweringContext, a: Any) -> Any:
    """An aten argument as lowerings see it: tensors as TensorValues, sizes as sympy expressions,
    dtypes and devices as their names."""
    if isinstance(a, Value):
        if a not in ctx.env:
            raise LoweringError(f"%{a.name} is used before it is defined", ctx.node)
        return ctx.env[a]
    if isinstance(a, SymExpr):
        return exprs.parse(a.expr)
    if isinstance(a, (DType, Device)):
        return a.name
    if isinstance(a, list):
        return [convert_arg(ctx, x) for x in a]
    if isinstance(a, tuple):
        return tuple(convert_arg(ctx, x) for x in a)
    return a



def fallback(ctx: LoweringContext, node: Any = None, kind: str = "fallback",
             replace: dict[Value, TensorValue] | None = None,
             sizes: Sequence[Sequence[Any]] | None = None) -> tuple[BufferValue | None, ...]:
    """Call the aten op as is. Tensor arguments go by reference (strided views of buffers);
    every other argument keeps its fireclay-ir form (DType, Device, SymExpr...). ``replace``
    passes other values for some arguments: a copy in another layout, or a padded one, whose
    results then have other ``sizes`` (see :meth:`LoweringContext.extern`)."""
    node = node or ctx.node
    replace = replace or {}

    def arg(a: Any) -> Any:
        if isinstance(a, Value):
            v = replace[a] if a in replace else convert_arg(ctx, a)
            if isinstance(v, TensorValue):
                if a not in replace and not isinstance(v, BufferValue):
                    # Computed into memory once: later views of it (a transposed operand of the
                    # next matmul) are strided views of this buffer, not a second computation.
                    v = ctx.env[a] = ctx.realize(v)
                return ctx.realize_strided(v)
            return v
        if isinstance(a, SymExpr):
            return exprs.parse(a.expr)
        if isinstance(a, (list, tuple)):
            return type(a)(arg(x) for x in a)
        return a

    return ctx.extern(node.op, arg(node.args), {k: arg(v) for k, v in node.kwargs.items()}, kind=kind, sizes=sizes)
