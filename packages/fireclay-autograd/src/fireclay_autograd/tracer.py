"""Record the ATen calls a computation makes into a fireclay-ir Graph.

:class:`AtenTracer` is a ``TorchDispatchMode``: every op reaching the dispatcher below autograd
(the forward ops, and, when the backward is traced, the backward ops too) arrives at
``__torch_dispatch__``, runs on meta tensors to learn its output metadata, and is appended to
the graph as an ``aten::`` node. Tensors flowing through the trace are :class:`FakeTensor` s
carrying the IR value that names them.

The recorded graph is *imperative*: in-place ops and views are recorded as they happen, and a
value names a tensor object whose contents may change. :mod:`fireclay_autograd.functionalize`
turns it into a pure dataflow graph.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import torch
from torch.utils import _pytree as pytree

from fireclay_autograd.convert import scalar_type, tensor_meta, to_ir_atom
from fireclay_autograd.decompose import decomposition_for
from fireclay_autograd.executor import op_name
from fireclay_autograd.fake import FakeMode, FakeTensor, fake_like, fake_of_meta, mode_for, sym_atom, value_of
from fireclay_ir import Graph, InputSpec, IRError, ScalarType, TensorMeta, Value
from fireclay_shapes.torch import CompilerDispatchMode

# Meta keys of the torch-dialect node that are carried over onto every aten node it produces.
CARRIED_META = ("source", "stack", "module")
# Where the forward leaves a torch node's meta on the autograd nodes it creates, so that the
# backward ops those run carry the same source line.
AUTOGRAD_META_KEY = "fireclay.meta"


class TracingError(RuntimeError):
    """An op could not be traced; the message names the op and the user's source line."""


class AtenTracer(CompilerDispatchMode):
    """Records aten calls on :class:`FakeTensor` s into ``graph``.

    ``decompose``: replace non-core ops by their decompositions (see
    :mod:`fireclay_autograd.decompose`). Real tensors met during the trace (constants made by
    ``torch.tensor(...)`` in the user's code) become graph inputs of kind ``constant``; they are
    listed in :attr:`constants` by name. ``mode``: the fake mode (and so the ShapeEnv of
    symbolic sizes) the trace runs in; a static one by default.
    """

    def __init__(self, graph: Graph, *, decompose: bool = True, mode: FakeMode | None = None):
        super().__init__()
        self.graph = graph
        self.decompose = decompose
        self.mode = mode if mode is not None else mode_for()
        self.constants: dict[str, torch.Tensor] = {}
        self._node_meta: dict[str, Any] = {}
        self._constant_fakes: dict[int, FakeTensor] = {}

    # -- inputs and context
    def add_input(self, name: str, example: torch.Tensor, spec: InputSpec | None = None,
                  requires_grad: bool | None = None, meta: TensorMeta | None = None) -> FakeTensor:
        """A graph input with the metadata of ``example`` (or of the IR type ``meta``, whose
        sizes may be symbolic), and the fake that stands for it."""
        if meta is not None:
            rg = bool(example.requires_grad if requires_grad is None else requires_grad)
            fake = fake_of_meta(meta, self.mode, rg)
        else:
            fake = fake_like(example, self.mode, requires_grad=requires_grad)
        fake.value = self.graph.add_input(name, tensor_meta(fake), spec)
        return fake

    @contextlib.contextmanager
    def node_meta(self, meta: dict[str, Any]) -> Iterator[None]:
        """Within the block, recorded nodes carry ``meta`` (the torch node's source and so on)."""
        saved = self._node_meta
        self._node_meta = {**saved, **meta}
        try:
            yield
        finally:
            self._node_meta = saved

    # -- the mode
    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func in _METADATA_QUERIES:
            # A kernel asking a fake for its sizes (symbolic sizes are answered through the
            # dispatcher): answered from the meta tensor inside, not recorded.
            return _answer_query(func, args, kwargs)
        if self.decompose:
            if func._schema.is_mutable:
                out = self._decompose_mutation(func, args, kwargs)
            else:
                decomposition = decomposition_for(func)
                out = NotImplemented
                if decomposition is not None:
                    with self:
                        out = decomposition(*args, **kwargs)
            if out is not NotImplemented:
                return out
        return self._record(func, args, kwargs)

    def _decompose_mutation(self, func, args, kwargs):
        """``x.op_(...)`` whose functional ``op`` is not core becomes ``x.copy_(op(x, ...))`` with
        ``op`` decomposed; core ones are recorded whole for functionalization to rewrite."""
        functional = functional_variant(func)
        if (functional is None or functional.is_view or decomposition_for(functional) is None
                or len(func._schema.returns) != 1):
            return NotImplemented
        target = _mutated_argument(func, 0, args, kwargs)
        if target is None or target is not (args[0] if args else None):
            return NotImplemented
        with self:
            result = functional(*args, **kwargs)
            target.copy_(result)
        return target

    def lift_constant(self, t: torch.Tensor) -> FakeTensor:
        """The fake standing for real tensor ``t``, which becomes a ``constant`` graph input."""
        fake = self._constant_fakes.get(id(t))
        if fake is None:
            name = f"_const{len(self.constants)}"
            self.constants[name] = t
            fake = fake_like(t, self.mode, requires_grad=False)
            fake.value = self.graph.add_input(name, tensor_meta(t), InputSpec("constant", name))
            self._constant_fakes[id(t)] = fake
        return fake

    def _record(self, func, args, kwargs):
        name = op_name(func)
        lift = lambda x: self.lift_constant(x) if isinstance(x, torch.Tensor) and not isinstance(x, FakeTensor) else x  # noqa: E731
        args = map_leaves(lift, args)
        kwargs = map_leaves(lift, kwargs)
        if func._opname in _INDEXING and len(args) > 1 and _foreign_indices(args[0], args[1]):
            with self:  # the copies are recorded too
                args = (args[0], [i if i is None or i.device == args[0].device else i.to(args[0].device)
                                  for i in args[1]], *args[2:])
        if torch.Tag.data_dependent_output in func.tags:
            raise TracingError(f"{name} produces a data-dependent value (like .item() or .tolist()), which a "
                               f"graph cannot hold yet{self._where()}\n  move it out of the compiled region")
        device = None
        try:
            if func._opname in _METADATA_MUTATIONS and args and isinstance(args[0], FakeTensor):
                # The fake's own sizes cannot change; the meta tensor inside it can, and later
                # ops read that (functionalization rebinds the value to the view it became).
                device = args[0].device
                rest = pytree.tree_map_only(FakeTensor, lambda t: t.meta, args[1:])
                out = func(args[0].meta, *rest, **kwargs)
            else:
                out = self.mode.run(func, args, kwargs)
        except Exception as exc:
            raise TracingError(f"cannot trace {name}: {exc}{self._where()}") from exc
        flat_out = list(out) if isinstance(out, (tuple, list)) else [out]
        types = []
        for k, o in enumerate(flat_out):
            if isinstance(o, torch.Tensor):
                types.append(tensor_meta(o, device).with_(requires_grad=False))
            elif o is None:
                types.append(ScalarType("opaque"))
            elif isinstance(o, torch.SymInt) or _size_result(func, k, o):
                types.append(ScalarType("int"))
            elif isinstance(o, (int, float, bool)):
                raise TracingError(f"{name} produces a data-dependent Python value, which a graph cannot "
                                   f"hold yet{self._where()}; move .item()/.tolist() out of the compiled region")
            else:
                types.append(scalar_type(o))
        ir_args = map_leaves(_to_ir, args)
        ir_kwargs = map_leaves(_to_ir, kwargs)
        meta = {k: self._node_meta[k] for k in CARRIED_META if k in self._node_meta}
        if not meta:
            meta = self._backward_source()
        meta.update({k: v for k, v in self._node_meta.items() if k.startswith("autograd.")})
        node_out = self.graph.call(name, ir_args, ir_kwargs, out=types, meta=meta)
        wrapped = [self._wrap(func, i, o, v, args, kwargs) for i, (o, v) in enumerate(zip(flat_out, node_out))]
        if isinstance(out, tuple):
            return tuple(wrapped)
        if isinstance(out, list):
            return wrapped
        return wrapped[0]

    def _wrap(self, func, index, out, value: Value, args, kwargs) -> Any:
        if not isinstance(out, torch.Tensor):
            return out
        mutated = _mutated_argument(func, index, args, kwargs)
        if mutated is not None:
            return mutated  # an in-place or out= op returns the very tensor it wrote
        if value_of(out) is not None:
            out = FakeTensor(out.meta, out.device, self.mode)  # a fresh name for a fresh result
        out.value = value
        return out

    @staticmethod
    def _backward_source() -> dict[str, Any]:
        # While the backward runs, the autograd node being executed is the one the forward
        # tagged with the torch node's meta.
        current = torch._C._current_autograd_node()
        if current is None:
            return {}
        return dict(current.metadata.get(AUTOGRAD_META_KEY, {}))

    def _where(self) -> str:
        src = self._node_meta.get("source")
        if not src:
            return ""
        return f"\n  at {src.get('file')}:{src.get('line')}: {str(src.get('text', '')).strip()}"


_aten = torch.ops.aten
_METADATA_QUERIES = frozenset(
    getattr(getattr(_aten, name), overload)
    for name, overload in (("size", "int"), ("size", "default"), ("sym_size", "int"), ("sym_size", "default"),
                           ("stride", "int"), ("stride", "default"), ("sym_stride", "int"),
                           ("sym_stride", "default"), ("numel", "default"), ("sym_numel", "default"),
                           ("sym_storage_offset", "default"), ("dim", "default"), ("is_contiguous", "default"),
                           ("is_contiguous", "memory_format"))
    if hasattr(getattr(_aten, name, None), overload))
# In-place ops that change only a tensor's sizes or strides.
_METADATA_MUTATIONS = frozenset({"t_", "transpose_", "unsqueeze_", "squeeze_", "as_strided_"})
def _answer_query(func, args, kwargs) -> Any:
    """Sizes, strides and the like of a fake, read off the meta tensor in Python (calling the
    op itself with symbolic sizes trips an assert in torch's argument parser)."""
    t = args[0].meta if isinstance(args[0], FakeTensor) else args[0]
    name, rest = func._opname, list(args[1:]) + list(kwargs.values())
    if name in ("size", "sym_size"):
        return t.shape[rest[0]] if rest else tuple(t.shape)
    if name in ("stride", "sym_stride"):
        return t.stride()[rest[0]] if rest else tuple(t.stride())
    if name in ("numel", "sym_numel"):
        n = 1
        for d in t.shape:
            n = n * d
        return n
    if name == "sym_storage_offset":
        return t.storage_offset()
    if name == "dim":
        return t.dim()
    return t.is_contiguous(*rest)


# In-place overloads whose functional twin has another overload name.
_FUNCTIONAL_OVERLOADS = {("bernoulli_", "float"): ("bernoulli", "p")}


def functional_variant(func: torch._ops.OpOverload) -> torch._ops.OpOverload | None:
    """``aten.add_.Tensor`` -> ``aten.add.Tensor`` (the same overload without the trailing
    underscore), when torch has it."""
    if func.namespace != "aten":
        return None  # a custom operator's name says nothing of its functional twin
    special = _FUNCTIONAL_OVERLOADS.get((func._opname, func._overloadname))
    if special is not None:
        return getattr(getattr(torch.ops.aten, special[0]), special[1])
    name = func._opname
    if not name.endswith("_") or name.startswith("_") and name.count("_") == 2:
        return None
    packet = getattr(torch.ops.aten, name[:-1], None)
    if packet is None:
        return None
    return getattr(packet, func._overloadname, None)


def map_leaves(fn, x: Any) -> Any:
    """``pytree.tree_map(fn, x)`` for an op's arguments. Those are tuples, lists and dicts of
    leaves, walked here directly (pytree's general machinery costs more than the rest of
    recording a node); any other container pytree knows goes to pytree."""
    t = type(x)
    if t is tuple or t is list:
        return t([map_leaves(fn, a) for a in x])
    if t is dict:
        return {k: map_leaves(fn, v) for k, v in x.items()}
    if t in pytree.SUPPORTED_NODES or isinstance(x, tuple):
        return pytree.tree_map(fn, x)
    return fn(x)


def _to_ir(x: Any) -> Any:
    if isinstance(x, FakeTensor):
        value = value_of(x)
        if value is None:
            raise IRError("a fake tensor from outside this trace reached the tracer")
        return value
    return to_ir_atom(sym_atom(x))


def _mutated_argument(func, index: int, args, kwargs) -> Any:
    """The argument an op's ``index``-th result is written into (``Tensor(a!)``), if any."""
    returns = func._schema.returns
    if index >= len(returns):
        return None
    alias = returns[index].alias_info
    if alias is None or not alias.is_write:
        return None
    for pos, arg in enumerate(func._schema.arguments):
        if arg.alias_info is not None and arg.alias_info.before_set == alias.before_set:
            if arg.kwarg_only or arg.name in kwargs:
                return kwargs.get(arg.name)
            return args[pos] if pos < len(args) else None
    return None


def _size_result(func, index: int, value: Any) -> bool:
    """Whether ``value``, the ``index``-th result of ``func``, is a size the op derives from its
    inputs' metadata rather than their data: an int where the schema returns an int, from an op
    not tagged as data-dependent (fused attention's ``max_q``/``max_k``, the sequence lengths).
    Results here come from meta kernels, which cannot read data. The caller keeps the Python int,
    which later ops take as a constant, as they would a static size."""
    if not isinstance(value, int) or isinstance(value, bool) or torch.Tag.data_dependent_output in func.tags:
        return False
    returns = func._schema.returns
    return index < len(returns) and str(returns[index].type) in ("int", "SymInt")


# Ops taking index tensors as their second argument. Eager takes CPU index tensors for a tensor
# on any device and copies them itself; in a graph the copy is explicit, so that generated kernels
# only ever read one device's memory (the backward of ``x[cpu_idx]`` included).
_INDEXING = {"index", "_unsafe_index", "index_put", "index_put_", "_index_put_impl_", "_unsafe_index_put"}


def _foreign_indices(target: Any, indices: Any) -> bool:
    return (isinstance(target, torch.Tensor) and isinstance(indices, (list, tuple))
            and any(isinstance(i, torch.Tensor) and i.device != target.device for i in indices))
