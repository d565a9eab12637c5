"""CUDA graphs for any callable on tensors (``mode="reduce-overhead"``): record the whole call
once, then replay it with one launch, so the per-kernel CPU cost (Python wrapper, Triton's
launcher, the driver) is paid once instead of on every call.

``cudagraphify(fn, example_inputs)`` returns a callable with ``fn``'s signature. Per input
*signature* (each tensor's shape, strides, dtype and device; each other argument's value):

1. the first call runs ``fn`` plainly on a side stream (warm-up: Triton compiles and autotunes,
   lazily initialised state settles; nothing of that may happen during a capture) and notes
   where each input tensor lives;
2. the second call records a graph. An input whose storage is where it was at the warm-up
   (parameters, buffers, anything the caller keeps in place) is read in place by the graph and
   never copied; every other input gets a *static buffer* the graph reads, and each replay
   copies the new input into it (skipped when the caller passes the static buffer itself);
3. later calls replay. If an input read in place has moved, that input is demoted to a static
   buffer and the signature is recorded again.

At most ``max_graphs`` graphs are recorded per callable; a new signature after that, inputs on
another device, an argument that is neither a tensor nor a plain constant, tensors that need
gradients under grad mode, or a failed capture make the call run plainly, with one log line per
cause (logger ``fireclay_triton``).

**Outputs.** By default every call returns *new* tensors: the graph writes its outputs into one
packed staging buffer inside the graph, and each call copies that buffer once (one copy, not one
per output) into a fresh allocation the outputs are views of, with their recorded strides when
they are dense. This differs from torch.compile's reduce-overhead, whose outputs live in the
graph's memory and are overwritten by the next replay: here a forward's outputs (activations
saved for the backward among them) stay valid when the forward runs again before the backward,
and results a caller keeps are never changed behind its back. The price is one device copy of
the outputs per call. ``copy_outputs=False`` returns the graph's own output tensors instead
(torch's behaviour: no copy; valid only until the next call of the same callable).

**Memory caveats.** Each recorded graph keeps, for the life of the callable: the memory of every
intermediate it allocated during capture (a private pool, shared between this callable's graphs
because they never run concurrently), its outputs and staging buffer, and one static buffer per
copied input. Up to ``max_graphs`` signatures are held at once, so a callable seeing many shapes
can hold several times the memory of one plain call; drop the callable (or call ``reset()``) to
release it. Inputs read in place are referenced only by address; they are checked by address at
every replay, never kept alive.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

log = logging.getLogger("fireclay_triton")

_CONSTANT_TYPES = (int, float, bool, str, type(None), torch.dtype, torch.device)
_ALIGN = 256  # bytes between outputs in the staging buffer (any dtype's alignment)


@dataclass
class _OutputSpec:
    """Where one output lives in the staging buffer (or a constant, ``index`` < 0)."""

    offset: int
    size: tuple
    stride: tuple
    dtype: torch.dtype
    span: int  # elements from the output's first to one past its last
    constant: Any = None
    index: int = 0
    itemsize: int = 1


@dataclass
class _Recorded:
    graph: Any
    static: list  # per input: the tensor the graph reads (a static buffer or the caller's tensor) or None
    copied: list[int]  # inputs copied into their static buffer before each replay
    in_place: dict[int, int]  # input index -> address the graph reads it at
    outputs: list  # the graph's output objects (tensors in graph memory, or constants)
    staging: torch.Tensor | None
    specs: list[_OutputSpec] = field(default_factory=list)
    dtypes: tuple = ()  # the dtypes of the tensor outputs
    single: bool = False  # fn returned one tensor, not a sequence
    kind: type = tuple  # the sequence type fn returned


def _signature(inputs: Sequence[Any]) -> tuple | str:
    """The call's key, or a reason the call cannot be graphed."""
    key = []
    device = None
    for x in inputs:
        if isinstance(x, torch.Tensor):
            if x.device.type != "cuda":
                return f"an input is on {x.device}, not a CUDA device"
            if device is None:
                device = x.device
            elif x.device != device:
                return "inputs are on several CUDA devices"
            if x.requires_grad and torch.is_grad_enabled():
                return "an input needs gradients under grad mode (a replayed graph records no autograd history)"
            key.append((tuple(x.shape), x.stride(), x.dtype, x.device.index))
        elif isinstance(x, _CONSTANT_TYPES):
            key.append((type(x), x))
        else:
            return f"an argument is a {type(x).__name__}, neither a tensor nor a constant"
    if device is None:
        return "no CUDA tensor among the inputs"
    return tuple(key)


def _dense_span(t: torch.Tensor) -> int:
    return 1 + sum((n - 1) * s for n, s in zip(t.shape, t.stride()) if n > 0) if t.numel() else 0


class CudaGraphed:
    """``fn`` recorded into CUDA graphs per input signature; see the module docstring."""

    def __init__(self, fn: Callable[..., Any], example_inputs: Sequence[Any] | None = None, *,
                 max_graphs: int = 8, copy_outputs: bool = True):
        self.fn = fn
        self.max_graphs = max_graphs
        self.copy_outputs = copy_outputs
        self.graphs: dict[tuple, _Recorded] = {}
        self._warm: dict[tuple, list[int | None]] = {}  # signature -> input addresses at the warm-up
        self._demoted: dict[tuple, set[int]] = {}  # signature -> inputs that moved: always copied
        self._noted: set[str] = set()
        self._pool = None
        self.plain_calls = 0  # calls that ran fn without a graph (warm-ups included)
        self.recordings = 0
        self.replays = 0

    def reset(self) -> None:
        """Drop every recorded graph and its memory."""
        self.graphs.clear()
        self._warm.clear()
        self._demoted.clear()
        self._pool = None

    def _note(self, reason: str) -> None:
        if reason not in self._noted:
            self._noted.add(reason)
            log.info("fireclay-triton: CUDA graphs off for a call of %s: %s; it runs without a graph",
                     getattr(self.fn, "__name__", type(self.fn).__name__), reason)

    def _plain(self, inputs: tuple) -> Any:
        self.plain_calls += 1
        return self.fn(*inputs)

    def __call__(self, *inputs: Any) -> Any:
        key = _signature(inputs)
        if isinstance(key, str):
            self._note(key)
            return self._plain(inputs)
        found = self.graphs.get(key)
        if found is not None:
            moved = [i for i, ptr in found.in_place.items() if inputs[i].data_ptr() != ptr]
            if not moved:
                return self._replay(found, inputs)
            self._demoted.setdefault(key, set()).update(moved)
            del self.graphs[key]
            return self._record(key, inputs)
        if key not in self._warm:
            return self._warm_up(key, inputs)
        if len(self.graphs) >= self.max_graphs:
            self._note(f"{self.max_graphs} input signatures are recorded already (max_graphs)")
            return self._plain(inputs)
        return self._record(key, inputs)

    def _warm_up(self, key: tuple, inputs: tuple) -> Any:
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            out = self._plain(inputs)
        torch.cuda.current_stream().wait_stream(stream)
        self._warm[key] = [x.data_ptr() if isinstance(x, torch.Tensor) else None for x in inputs]
        return out

    def _record(self, key: tuple, inputs: tuple) -> Any:
        warm = self._warm[key]
        demoted = self._demoted.get(key, set())
        static: list = []
        copied: list[int] = []
        in_place: dict[int, int] = {}
        for i, x in enumerate(inputs):
            if not isinstance(x, torch.Tensor):
                static.append(x)
            elif x.data_ptr() == warm[i] and i not in demoted:
                in_place[i] = x.data_ptr()
                static.append(x)
            else:
                buf = torch.empty_strided(x.shape, x.stride(), dtype=x.dtype, device=x.device)
                buf.copy_(x)
                copied.append(i)
                static.append(buf)
        if self._pool is None:
            self._pool = torch.cuda.graph_pool_handle()
        graph = torch.cuda.CUDAGraph()
        try:
            torch.cuda.synchronize()
            with torch.cuda.graph(graph, pool=self._pool):
                outputs = self.fn(*static)
                packed = outputs if isinstance(outputs, (tuple, list)) else (outputs,)
                staging, specs = self._stage(packed) if self.copy_outputs else (None, [])
        except Exception as exc:  # an op that cannot be captured (a host sync, a CPU tensor...)
            self._note(f"recording failed ({type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''})")
            self._warm.pop(key, None)
            self.max_graphs = len(self.graphs)  # do not try again for new signatures either
            return self._plain(inputs)
        # keep in-place inputs by address only: holding them would keep a caller's memory alive
        recorded = _Recorded(graph, [None if i in in_place else s for i, s in enumerate(static)], copied,
                             in_place, list(packed), staging, specs,
                             dtypes=tuple({s.dtype for s in specs if s.index >= 0}), single=not isinstance(outputs, (tuple, list)),
                             kind=list if isinstance(outputs, list) else tuple)
        self.graphs[key] = recorded
        self.recordings += 1
        return self._replay(recorded, inputs, fresh_copies=False)

    def _stage(self, outputs: Sequence[Any]) -> tuple[torch.Tensor | None, list[_OutputSpec]]:
        """Inside the capture: copy every tensor output into one staging buffer."""
        specs, offset = [], 0
        for j, o in enumerate(outputs):
            if not isinstance(o, torch.Tensor):
                specs.append(_OutputSpec(0, (), (), torch.uint8, 0, constant=o, index=-1))
                continue
            span = _dense_span(o)
            dense = span == o.numel()
            stride = o.stride() if dense else torch.empty(o.shape, device="meta").stride()
            specs.append(_OutputSpec(offset, tuple(o.shape), tuple(stride), o.dtype, o.numel(), index=j,
                                     itemsize=o.element_size()))
            offset += -(-o.numel() * o.element_size() // _ALIGN) * _ALIGN
        if not any(s.index >= 0 for s in specs):
            return None, specs
        device = next(o.device for o in outputs if isinstance(o, torch.Tensor))
        staging = torch.empty(max(offset, _ALIGN), dtype=torch.uint8, device=device)
        for s in specs:
            if s.index >= 0:
                _view(staging, s).copy_(outputs[s.index])
        return staging, specs

    def _replay(self, rec: _Recorded, inputs: tuple, fresh_copies: bool = True) -> Any:
        if fresh_copies:
            for i in rec.copied:
                x, buf = inputs[i], rec.static[i]
                if x.data_ptr() != buf.data_ptr():
                    buf.copy_(x)
        rec.graph.replay()
        self.replays += 1
        if not self.copy_outputs:
            result = rec.outputs
        elif rec.staging is None:
            result = [s.constant for s in rec.specs]
        else:
            fresh = torch.empty_like(rec.staging)
            fresh.copy_(rec.staging)
            typed = {dtype: fresh.view(dtype) for dtype in rec.dtypes}  # one view per dtype, not per output
            result = [s.constant if s.index < 0 else
                      typed[s.dtype].as_strided(s.size, s.stride, s.offset // s.itemsize) for s in rec.specs]
        if rec.single:
            return result[0]
        return list(result) if rec.kind is list else tuple(result)


def _view(buffer: torch.Tensor, s: _OutputSpec) -> torch.Tensor:
    nbytes = s.span * torch.empty((), dtype=s.dtype).element_size()
    return buffer[s.offset: s.offset + nbytes].view(s.dtype).as_strided(s.size, s.stride)


def cudagraphify(fn: Callable[..., Any], example_inputs: Sequence[Any] | None = None, *, max_graphs: int = 8,
                 copy_outputs: bool = True) -> CudaGraphed:
    """``fn`` (tensors in, a tuple of tensors out) run through CUDA graphs: warm-up, recording
    and replay per input signature, plain calls where graphs cannot serve. ``example_inputs`` is
    accepted for the backend signature ``(fn, inputs) -> callable``; nothing is recorded until the
    first calls. See the module docstring for what outputs are and what memory is kept."""
    return CudaGraphed(fn, example_inputs, max_graphs=max_graphs, copy_outputs=copy_outputs)
