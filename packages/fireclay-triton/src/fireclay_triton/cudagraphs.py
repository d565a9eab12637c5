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

**Outputs.** A replay writes its outputs where the recording put them, so by default
(``copy_outputs=True``) each recorded graph hands out *aliases* of that memory and replays only when
no alias it handed out last time is still in use (each alias has storage of its own, so a
caller's views and detached copies of an output count as uses; a storage weak reference tells).
Graphs record into up to two memory pools: while the outputs of a call are still held (``out =
model(x)`` in a loop holds the previous ``out`` during the next call; a training step's forward
outputs are held until its backward), the next call replays the same signature's graph of the
other pool, recorded on first need. Results a caller keeps are never changed behind its back, and
no output is copied; when both pools' outputs are in use, the call runs without a graph. Outputs
that live in an input's memory (an input returned, or a view of one) are copied.
``copy_outputs=False`` is torch.compile's behaviour: one pool, the graph's own output tensors
returned, valid only until the next call of the same callable.

**Memory caveats.** Each recorded graph keeps, for the life of the callable: the memory of every
intermediate it allocated during capture (a private pool, shared between the graphs recorded into
it: a pool's graphs replay only when none of its outputs is in use), its outputs, and one static
buffer per copied input. A second pool, made only when a caller holds outputs across calls, can
double that. Up to ``max_graphs`` signatures are held at once, so a callable seeing many shapes
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
from torch.multiprocessing.reductions import StorageWeakRef
from torch.utils.dlpack import from_dlpack, to_dlpack

log = logging.getLogger("fireclay_triton")

_CONSTANT_TYPES = (int, float, bool, str, type(None), torch.dtype, torch.device)
POOLS = 2  # memory pools a callable records into when its outputs are held across calls
VARIANTS = 4  # graphs per signature and pool that read in-place inputs at other addresses
# Addresses of storages recorded graphs hand out: an input living there (a forward's saved tensors
# read by a backward) stays put from call to call, so a graph reads it in place. (A stale entry
# costs nothing: every replay checks in-place inputs' addresses.)
_GRAPH_STORAGES: set[int] = set()


@dataclass(frozen=True)
class _OutputPlan:
    """How one output is handed to the caller: a view of the alias of graph storage ``storage``
    (``storage`` >= 0), a fresh copy (``copy``: its memory is an input's, or it is empty), or a
    constant."""

    storage: int = -1
    dtype: torch.dtype | None = None
    size: tuple = ()
    stride: tuple = ()
    offset: int = 0  # in elements of ``dtype``
    copy: bool = False
    constant: Any = None


def plan_outputs(outputs: Sequence[Any], input_storages: set[int]) -> tuple[list[torch.Tensor], list[_OutputPlan]]:
    """The distinct storages the outputs live in (each as a flat byte tensor over the whole
    storage) and a plan per output. Outputs in an input's storage (``input_storages``: their
    addresses), empty ones, and ones a byte view cannot express are copied instead."""
    storages: list[torch.Tensor] = []
    index: dict[int, int] = {}
    plans = []
    for o in outputs:
        if not isinstance(o, torch.Tensor):
            plans.append(_OutputPlan(constant=o))
            continue
        storage = o.untyped_storage()
        address = storage.data_ptr()
        if (o.numel() == 0 or address in input_storages or storage.nbytes() % o.element_size()
                or o.is_conj() or o.is_neg()):  # (a view of the bytes would lose a lazy conjugate or negation)
            plans.append(_OutputPlan(copy=True))
            continue
        if address not in index:
            index[address] = len(storages)
            storages.append(torch.empty(0, dtype=torch.uint8, device=o.device).set_(storage))
        plans.append(_OutputPlan(storage=index[address], dtype=o.dtype, size=tuple(o.shape),
                                 stride=o.stride(), offset=o.storage_offset()))
    return storages, plans


def hand_out(outputs: Sequence[Any], storages: Sequence[torch.Tensor], plans: Sequence[_OutputPlan]
             ) -> tuple[list[Any], list[StorageWeakRef]]:
    """The caller's outputs: views of one fresh alias per graph storage (its own storage object,
    the same memory), and weak references that tell whether any of them is still in use."""
    aliases = [from_dlpack(to_dlpack(s)) for s in storages]
    typed: dict[tuple[int, torch.dtype], torch.Tensor] = {}
    result: list[Any] = []
    for o, p in zip(outputs, plans):
        if p.storage >= 0:
            assert p.dtype is not None
            base = typed.get((p.storage, p.dtype))
            if base is None:
                base = typed[(p.storage, p.dtype)] = aliases[p.storage].view(p.dtype)
            result.append(base.as_strided(p.size, p.stride, p.offset))
        else:
            result.append(o.clone() if p.copy else p.constant)
    return result, [StorageWeakRef(a.untyped_storage()) for a in aliases]


@dataclass
class _Recorded:
    graph: Any
    static: list  # per input: the tensor the graph reads (a static buffer or the caller's tensor) or None
    copied: list[int]  # inputs copied into their static buffer before each replay
    in_place: dict[int, int]  # input index -> address the graph reads it at
    outputs: list  # the graph's output objects (tensors in graph memory, or constants)
    storages: list = field(default_factory=list)  # the output storages handed out as aliases
    plans: list[_OutputPlan] = field(default_factory=list)
    single: bool = False  # fn returned one tensor, not a sequence
    kind: type = tuple  # the sequence type fn returned


@dataclass
class _Pool:
    """A private memory pool and the graphs recorded into it. Graphs of one pool share memory, so
    one replays only when no output any of them handed out is still in use."""

    handle: Any
    # signature -> its graphs, one per set of addresses its in-place inputs were at (a backward
    # reading the saved tensors of a forward replayed from either pool)
    graphs: dict[tuple, list[_Recorded]] = field(default_factory=dict)
    handed: list[StorageWeakRef] = field(default_factory=list)  # the last replay's aliases

    def in_use(self) -> bool:
        return not all(w.expired() for w in self.handed)

    def count(self) -> int:
        return sum(len(v) for v in self.graphs.values())


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


class CudaGraphed:
    """``fn`` recorded into CUDA graphs per input signature; see the module docstring."""

    def __init__(self, fn: Callable[..., Any], example_inputs: Sequence[Any] | None = None, *,
                 max_graphs: int = 8, copy_outputs: bool = True):
        self.fn = fn
        self.max_graphs = max_graphs  # per pool
        self.copy_outputs = copy_outputs
        self.pools: list[_Pool] = []
        self._warm: dict[tuple, list[int | None]] = {}  # signature -> input addresses at the warm-up
        self._demoted: dict[tuple, set[int]] = {}  # signature -> inputs that moved: always copied
        self._noted: set[str] = set()
        self._capture_failed = False
        self.plain_calls = 0  # calls that ran fn without a graph (warm-ups included)
        self.recordings = 0
        self.replays = 0

    @property
    def graphs(self) -> dict[tuple, _Recorded]:
        """The latest graph of each signature in the first pool."""
        return {k: v[-1] for k, v in self.pools[0].graphs.items()} if self.pools else {}

    def reset(self) -> None:
        """Drop every recorded graph and its memory."""
        self.pools.clear()
        self._warm.clear()
        self._demoted.clear()

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
        if key not in self._warm:
            return self._warm_up(key, inputs)
        free = [p for p in self.pools if not p.in_use()]
        for pool in free:
            variants = pool.graphs.get(key)
            if not variants:
                continue
            for rec in variants:
                if all(inputs[i].data_ptr() == ptr for i, ptr in rec.in_place.items()):
                    return self._replay(pool, rec, inputs)
            if self._capture_failed or pool.count() >= self.max_graphs:
                break
            if len(variants) < VARIANTS:  # in-place inputs at new addresses: another graph reads them there
                return self._record(pool, key, inputs, in_place_ok=set(variants[-1].in_place))
            # inputs that keep moving are copied from now on
            last = variants[-1]
            self._demoted.setdefault(key, set()).update(i for i, ptr in last.in_place.items()
                                                        if inputs[i].data_ptr() != ptr)
            for p in self.pools:
                p.graphs.pop(key, None)
            return self._record(pool, key, inputs)
        if self._capture_failed:
            return self._plain(inputs)
        if not free and len(self.pools) < (POOLS if self.copy_outputs else 1):
            self.pools.append(_Pool(torch.cuda.graph_pool_handle()))
            free = self.pools[-1:]
        if not free:
            self._note("the outputs of earlier calls are still in use in every memory pool")
            return self._plain(inputs)
        pool = free[0]
        if pool.count() >= self.max_graphs:
            self._note(f"{self.max_graphs} graphs are recorded already (max_graphs)")
            return self._plain(inputs)
        return self._record(pool, key, inputs)

    def _warm_up(self, key: tuple, inputs: tuple) -> Any:
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            out = self._plain(inputs)
        torch.cuda.current_stream().wait_stream(stream)
        self._warm[key] = [x.data_ptr() if isinstance(x, torch.Tensor) else None for x in inputs]
        return out

    def _record(self, pool: _Pool, key: tuple, inputs: tuple, in_place_ok: set[int] | None = None) -> Any:
        """Record ``fn`` into ``pool``. Inputs read in place: those where they were at the warm-up
        or in memory a recorded graph hands out, or ``in_place_ok`` (those another graph of the
        signature reads in place), less the demoted ones."""
        warm = self._warm[key]
        demoted = self._demoted.get(key, set())
        static: list = []
        copied: list[int] = []
        in_place: dict[int, int] = {}
        for i, x in enumerate(inputs):
            if not isinstance(x, torch.Tensor):
                static.append(x)
            elif i not in demoted and (i in in_place_ok if in_place_ok is not None else
                                       x.data_ptr() == warm[i] or x.untyped_storage().data_ptr() in _GRAPH_STORAGES):
                in_place[i] = x.data_ptr()
                static.append(x)
            else:
                buf = torch.empty_strided(x.shape, x.stride(), dtype=x.dtype, device=x.device)
                buf.copy_(x)
                copied.append(i)
                static.append(buf)
        graph = torch.cuda.CUDAGraph()
        try:
            torch.cuda.synchronize()
            with torch.cuda.graph(graph, pool=pool.handle):
                outputs = self.fn(*static)
        except Exception as exc:  # an op that cannot be captured (a host sync, a CPU tensor...)
            self._note(f"recording failed ({type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''})")
            self._warm.pop(key, None)
            self._capture_failed = True  # do not try again for new signatures either
            return self._plain(inputs)
        packed = list(outputs) if isinstance(outputs, (tuple, list)) else [outputs]
        storages, plans = plan_outputs(packed, {s.untyped_storage().data_ptr() for s in static
                                                if isinstance(s, torch.Tensor)})
        _GRAPH_STORAGES.update(s.data_ptr() for s in storages)
        # keep in-place inputs by address only: holding them would keep a caller's memory alive
        recorded = _Recorded(graph, [None if i in in_place else s for i, s in enumerate(static)], copied,
                             in_place, packed, storages, plans, single=not isinstance(outputs, (tuple, list)),
                             kind=list if isinstance(outputs, list) else tuple)
        pool.graphs.setdefault(key, []).append(recorded)
        self.recordings += 1
        return self._replay(pool, recorded, inputs, fresh_copies=False)

    def _replay(self, pool: _Pool, rec: _Recorded, inputs: tuple, fresh_copies: bool = True) -> Any:
        if fresh_copies:
            for i in rec.copied:
                x, buf = inputs[i], rec.static[i]
                if x.data_ptr() != buf.data_ptr():
                    buf.copy_(x)
        rec.graph.replay()
        self.replays += 1
        if self.copy_outputs:
            result, pool.handed = hand_out(rec.outputs, rec.storages, rec.plans)
        else:
            result = rec.outputs
        if rec.single:
            return result[0]
        return list(result) if rec.kind is list else tuple(result)


def cudagraphify(fn: Callable[..., Any], example_inputs: Sequence[Any] | None = None, *, max_graphs: int = 8,
                 copy_outputs: bool = True) -> CudaGraphed:
    """``fn`` (tensors in, a tuple of tensors out) run through CUDA graphs: warm-up, recording
    and replay per input signature, plain calls where graphs cannot serve. ``example_inputs`` is
    accepted for the backend signature ``(fn, inputs) -> callable``; nothing is recorded until the
    first calls. See the module docstring for what outputs are and what memory is kept."""
    return CudaGraphed(fn, example_inputs, max_graphs=max_graphs, copy_outputs=copy_outputs)
