"""Tensors as fake (meta-device) tensors, and the recording of torch calls into the graph.

A :class:`TensorVar` pairs a graph Value with a fake tensor on the meta device that carries the
real tensor's shape, strides, dtype and requires_grad; the real device is kept beside it (meta
tensors forget it). A torch call on TensorVars runs once on the fakes to learn its outputs'
metadata and is recorded as one torch-dialect node.
"""

from __future__ import annotations

import dataclasses
import functools
import operator
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import torch

from fireclay_capture.errors import ObservedException, Unsupported
from fireclay_capture.variables.base import ConstVar, Var, const, is_constant_value
from fireclay_capture.variables.containers import BaseListVar, DictVar, ListVar, SliceVar, TupleVar
from fireclay_capture.variables.functions import BuiltinVar
from fireclay_ir import Device, DType, Layout, MemoryFormat, ScalarType, TensorMeta, Value
from fireclay_ir.dialects.torch import DENIED

if TYPE_CHECKING:
    from fireclay_capture.trace_state import TraceState

# Tensor methods and properties answered from the fake's metadata (guards pin that metadata).
METADATA_METHODS = frozenset({
    "size", "dim", "ndimension", "numel", "nelement", "stride", "is_contiguous", "is_floating_point",
    "is_complex", "element_size", "storage_offset", "is_signed", "has_names", "is_sparse",
    "__len__",
})
METADATA_PROPERTIES = frozenset({
    "shape", "dtype", "ndim", "requires_grad", "is_leaf", "is_sparse", "is_quantized", "is_meta",
    "layout", "names", "is_nested", "itemsize", "is_mkldnn",
})
# Properties that produce tensors: recorded as ``torch::Tensor.<name>`` nodes.
TENSOR_PROPERTIES = frozenset({"T", "mT", "H", "mH", "real", "imag", "data"})
# The function mode under which ``t[i, j]`` with tensor or int indices is ``aten.index``.
INDEX_MODE = "getitem_as_index"
# Methods whose results depend on tensor data: they end the trace.
DATA_DEPENDENT = frozenset({"item", "tolist", "numpy", "__bool__", "__int__", "__float__", "nonzero",
                            "unique", "any_", "__index__", "backward", "data_ptr", "untyped_storage"})


def device_str(device: Any) -> str:
    d = torch.device(device)
    if d.type == "cuda" and d.index is None:
        return "cuda:0"
    return str(d)


def meta_of(fake: torch.Tensor, device: str) -> TensorMeta:
    from fireclay_capture.dynamic import dim_of

    return TensorMeta(
        dtype=str(fake.dtype).replace("torch.", ""),
        shape=tuple(dim_of(s) for s in fake.shape),
        strides=tuple(dim_of(s) for s in fake.stride()),
        storage_offset=dim_of(fake.storage_offset()),
        device=device,
        requires_grad=bool(fake.requires_grad),
    )


def fake_from_real(t: torch.Tensor) -> torch.Tensor:
    fake = torch.empty_strided(tuple(t.shape), tuple(t.stride()), dtype=t.dtype, device="meta")
    if t.requires_grad:
        fake.requires_grad_(True)
    return fake


class TensorVar(Var):
    def __init__(self, value: Value, fake: torch.Tensor, device: str, source=None):
        self.value = value
        self.fake = fake
        self.device = device
        self.source = source

    def python_type(self):
        return torch.Tensor

    def truth(self, tx):
        raise Unsupported("a branch on a tensor's value (data-dependent control flow)")

    def unpack(self, tx):
        if self.fake.dim() == 0:
            raise Unsupported("iterating over a 0-d tensor")
        return [record_call(tx, "operator.getitem", operator.getitem, [self, const(i)], {})
                for i in range(self.fake.shape[0])]

    def getitem(self, tx, key):
        if INDEX_MODE in tx.function_modes or tx.call_log is not None:
            from fireclay_capture.variables.function_modes import getitem_as_index

            # Inside a vmapped function (a call log is kept), ``t[i]`` with 0-d integer index
            # tensors is indexing, as torch's vmap runs it, not a select by ``i.item()``.
            indexed = getitem_as_index(tx, self, key, scalar_indices_only=INDEX_MODE not in tx.function_modes)
            if indexed is not None:
                return indexed
        return record_call(tx, "operator.getitem", operator.getitem, [self, key], {})

    def setitem(self, tx, key, value):
        record_call(tx, "operator.setitem", operator.setitem, [self, key, value], {})

    def getattr(self, tx, name):
        if name == "device":
            return const(torch.device(self.device))
        if name in ("is_cuda", "is_cpu"):
            return const(self.device.startswith(name[3:]))
        if name in METADATA_PROPERTIES:
            return const(getattr(self.fake, name))
        if name in TENSOR_PROPERTIES:
            return record_call(tx, f"Tensor.{name}", lambda t: getattr(t, name), [self], {})
        if name == "grad":
            raise Unsupported("reading .grad of a tensor inside the captured function")
        if not hasattr(torch.Tensor, name):
            # A tensor may carry attributes of its own that the trace does not see.
            raise ObservedException(AttributeError, f"'Tensor' object has no attribute {name!r}", certain=False)
        return TensorMethodVar(self, name)

    def __repr__(self):
        return f"TensorVar(%{self.value.name}: {self.device} {tuple(self.fake.shape)})"


class TensorMethodVar(Var):
    def __init__(self, tensor: TensorVar, name: str):
        self.tensor, self.name = tensor, name

    def call(self, tx, args, kwargs):
        return tensor_method(tx, self.tensor, self.name, args, kwargs)

    def __repr__(self):
        return f"Tensor.{self.name} of {self.tensor}"

    def reconstruct(self, specs):
        if self.source is not None:
            return specs.output(self)
        return ("attr", specs.spec_of(self.tensor), self.name)


def tensor_method(tx: TraceState, t: TensorVar, name: str, args: list[Var], kwargs: dict[str, Var]) -> Var:
    if name in DATA_DEPENDENT:
        raise Unsupported(f"Tensor.{name}() needs the tensor's data (data-dependent)")
    if name in METADATA_METHODS:
        a = [x.as_python_constant() for x in args]
        k = {n: x.as_python_constant() for n, x in kwargs.items()}
        return const(getattr(t.fake, name)(*a, **k))
    if name == "type":
        return _tensor_type(tx, t, args, kwargs)
    method = getattr(torch.Tensor, name)
    return record_call(tx, f"Tensor.{name}", method, [t, *args], kwargs)


@functools.cache
def _legacy_type_names() -> dict[str, torch.dtype]:
    """``torch.FloatTensor``-style names of the CPU tensor types (``torch.cuda.*`` names also move
    the tensor: those calls run eagerly)."""
    names = {}
    for dtype in (torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.uint8, torch.int8,
                  torch.int16, torch.int32, torch.int64, torch.bool):
        legacy = torch.empty(0, dtype=dtype).type()
        names[legacy] = dtype
    return names


def _tensor_type(tx: TraceState, t: TensorVar, args: list[Var], kwargs: dict[str, Var]) -> Var:
    """``Tensor.type()``: the legacy type name, a constant of the trace; ``Tensor.type(dtype)`` and
    ``Tensor.type("torch.HalfTensor")``: a cast, recorded as ``Tensor.to`` (``Tensor.type`` itself is
    not an op of the torch dialect: given a string it imports a module by name)."""
    if not args and not kwargs:
        name = {v: k for k, v in _legacy_type_names().items()}.get(t.fake.dtype)
        if name is None:
            raise Unsupported(f"Tensor.type() of a {t.fake.dtype} tensor")
        return const(name if t.device == "cpu" else name.replace("torch.", f"torch.{t.device.split(':')[0]}.", 1))
    given = args[0] if args else kwargs.get("dtype")
    target = given.as_python_constant() if isinstance(given, ConstVar) else None
    if isinstance(target, str):
        target = _legacy_type_names().get(target)
    if not isinstance(target, torch.dtype) or set(kwargs) - {"dtype", "non_blocking"}:
        raise Unsupported("Tensor.type(...) with arguments other than a dtype or a legacy type name")
    return record_call(tx, "Tensor.to", torch.Tensor.to, [t, const(target)], {})


# --------------------------------------------------------------------------- recording


# Python number types torch takes for a dtype (``torch.zeros(n, dtype=int)``), as the dtype it reads.
_PYTHON_TYPE_DTYPES = {int: torch.int64, float: torch.float64, bool: torch.bool, complex: torch.complex128}


def _python_type_dtype(v: Var) -> torch.dtype | None:
    return _PYTHON_TYPE_DTYPES.get(v.fn) if isinstance(v, BuiltinVar) and isinstance(v.fn, type) else None


def _to_fake(v: Var) -> Any:
    if isinstance(v, TensorVar):
        return v.fake
    if isinstance(v, ConstVar):
        return v.value
    if (dtype := _python_type_dtype(v)) is not None:
        return dtype
    if isinstance(v, BaseListVar):
        items = [_to_fake(i) for i in v.items]
        return items if isinstance(v, ListVar) else tuple(items)
    if isinstance(v, SliceVar):
        return v.as_python_constant()  # names the bound that is not a constant
    raise Unsupported(f"passing {v} to a torch function")


def to_ir_arg(value: Any) -> Any:
    """A Python constant (or a fake-free structure) as an IR argument atom."""
    if isinstance(value, torch.dtype):
        return DType(str(value).replace("torch.", ""))
    if isinstance(value, torch.device):
        return Device(device_str(value))
    if isinstance(value, torch.memory_format):
        return MemoryFormat(str(value).replace("torch.", ""))
    if isinstance(value, torch.layout):
        return Layout(str(value).replace("torch.", "").replace("_", "_"))
    if isinstance(value, torch.SymInt):
        from fireclay_capture.dynamic import ir_symint

        return ir_symint(value)
    if isinstance(value, (torch.SymFloat, torch.SymBool)):
        raise Unsupported(f"a symbolic {type(value).__name__} argument")
    if isinstance(value, torch.Size):
        return tuple(to_ir_arg(s) for s in value)
    if isinstance(value, (tuple, list)):
        items = [to_ir_arg(v) for v in value]
        return items if isinstance(value, list) else tuple(items)
    if isinstance(value, slice):
        return slice(to_ir_arg(value.start), to_ir_arg(value.stop), to_ir_arg(value.step))
    if isinstance(value, range):
        return list(value)
    if value is None or value is Ellipsis or isinstance(value, (bool, int, float, str)):
        return value
    raise Unsupported(f"a {type(value).__name__} argument ({value!r}) cannot be put in a graph")


def _to_ir(v: Var) -> Any:
    if isinstance(v, TensorVar):
        return v.value
    if isinstance(v, ConstVar):
        return to_ir_arg(v.value)
    if (dtype := _python_type_dtype(v)) is not None:
        return to_ir_arg(dtype)
    if isinstance(v, BaseListVar):
        items = [_to_ir(i) for i in v.items]
        return items if isinstance(v, ListVar) else tuple(items)
    if isinstance(v, SliceVar):
        return to_ir_arg(v.as_python_constant())
    raise Unsupported(f"passing {v} to a torch function")


def tensors_in(vs: Sequence[Var]) -> list[TensorVar]:
    """The tensors among ``vs``, looking into lists and tuples."""
    out: list[TensorVar] = []
    for v in vs:
        if isinstance(v, TensorVar):
            out.append(v)
        elif isinstance(v, BaseListVar):
            out.extend(tensors_in(v.items))
    return out


def _is_device_like(value: Any) -> bool:
    if isinstance(value, torch.device):
        return True
    if isinstance(value, str):
        try:
            torch.device(value)
            return True
        except (RuntimeError, ValueError):
            return False
    return isinstance(value, int) and not isinstance(value, bool)


def _output_device(name: str, args: list[Var], kwargs: dict[str, Var], fake_args: list) -> str:
    if "device" in kwargs and kwargs["device"].is_constant() and kwargs["device"].as_python_constant() is not None:
        dev = kwargs["device"].as_python_constant()
        return device_str(f"cuda:{dev}" if isinstance(dev, int) else dev)
    if name == "Tensor.cpu":
        return "cpu"
    if name == "Tensor.cuda":
        dev = args[1].as_python_constant() if len(args) > 1 else kwargs.get("device", const(None)).as_python_constant()
        return device_str("cuda" if dev is None else (f"cuda:{dev}" if isinstance(dev, int) else dev))
    if name == "Tensor.to":
        for a in args[1:]:
            if isinstance(a, TensorVar):
                return a.device
            if a.is_constant() and not isinstance(a.as_python_constant(), (torch.dtype, bool)) \
                    and _is_device_like(a.as_python_constant()):
                dev = a.as_python_constant()
                return device_str(f"cuda:{dev}" if isinstance(dev, int) else dev)
    tensors = tensors_in(list(args) + list(kwargs.values()))
    devices = [t.device for t in tensors]
    for d in devices:
        if d != "cpu":
            return d
    return devices[0] if devices else "cpu"


def _meta_device_args(name: str, fake_args: list, fake_kwargs: dict) -> tuple[list, dict]:
    """Point device arguments at the meta device for the fake run."""
    if "device" in fake_kwargs and fake_kwargs["device"] is not None:
        fake_kwargs = dict(fake_kwargs, device="meta")
    if name == "Tensor.to":
        fake_args = [fake_args[0]] + [
            "meta" if (not isinstance(a, (torch.dtype, bool, torch.Tensor)) and _is_device_like(a)) else a
            for a in fake_args[1:]]
    if name in ("Tensor.cuda", "Tensor.cpu"):
        return [fake_args[0]], {}
    return fake_args, fake_kwargs


def _with_meta_device(fn):
    def run(*args, **kwargs):
        try:
            return fn(*args, device="meta", **kwargs)
        except TypeError:  # the function takes no device: run as is, then move the result
            out = fn(*args, **kwargs)
            return out.to("meta") if isinstance(out, torch.Tensor) else out

    return run


@dataclasses.dataclass(kw_only=True)
class CallRecord:
    """One torch call recorded while a vmapped function was traced: what the batching (vmap.py)
    replays with batched operands."""

    name: str  # the op name, as in ``torch::<name>``
    fn: Any  # the callable the fakes ran through
    args: list[Var]
    kwargs: dict[str, Var]
    result: Var
    node: Any  # the node recorded, None when the call folded to a constant


def record_call(tx: TraceState, name: str, fn: Any, args: list[Var], kwargs: dict[str, Var]) -> Var:
    """Run ``fn`` on fakes and record it as ``torch::<name>``; returns the Var of its result."""
    if tx.call_log is None:
        return _record_call(tx, name, fn, args, kwargs)
    n_nodes = len(tx.graph.nodes)
    result = _record_call(tx, name, fn, args, kwargs)
    node = tx.graph.nodes[-1] if len(tx.graph.nodes) > n_nodes else None
    tx.call_log.append(CallRecord(name=name, fn=fn, args=list(args), kwargs=dict(kwargs), result=result, node=node))
    return result


def _record_call(tx: TraceState, name: str, fn: Any, args: list[Var], kwargs: dict[str, Var]) -> Var:
    if name in DENIED:  # the call runs eagerly: a graph must not hold what no document may run
        raise Unsupported(f"{name} is not an op of the torch dialect (it reaches outside tensors)")
    fake_args = [_to_fake(a) for a in args]
    fake_kwargs = {k: _to_fake(v) for k, v in kwargs.items()}
    ir_args = [_to_ir(a) for a in args]
    ir_kwargs = {k: _to_ir(v) for k, v in kwargs.items()}
    device = _output_device(name, args, kwargs, fake_args)
    if tx.shapes is not None:
        return _record_symbolic(tx, name, fn, fake_args, fake_kwargs, ir_args, ir_kwargs, device)
    fake_args, fake_kwargs = _meta_device_args(name, fake_args, fake_kwargs)
    run = (lambda t: t) if name in ("Tensor.cuda", "Tensor.cpu") else fn
    if name.startswith("torch.") and "device" not in fake_kwargs and not tensors_in(list(args) + list(kwargs.values())):
        # A factory with no device argument makes its tensor on the meta device for the fake run.
        run = _with_meta_device(run)
    from fireclay_shapes.torch import CachedMetaKernels

    try:
        with CachedMetaKernels():  # repeated layers: each functional op's meta kernel runs once
            result = run(*fake_args, **fake_kwargs)
    except Unsupported:
        raise
    except NotImplementedError as e:
        raise Unsupported(f"torch.{name} has no meta implementation ({str(e).splitlines()[0]})") from None
    except Exception as e:
        first = str(e).splitlines()[0] if str(e) else type(e).__name__
        raise Unsupported(f"{name} failed on the traced shapes: {type(e).__name__}: {first}") from None
    return _record_result(tx, name, ir_args, ir_kwargs, result, device)


def _record_symbolic(tx, name, fn, fake_args, fake_kwargs, ir_args, ir_kwargs, device) -> Var:
    """The dynamic-shape path: fakes are fireclay-shapes FakeTensors that know their device."""
    try:
        with tx.shapes.mode:
            result = fn(*fake_args, **fake_kwargs)
    except Unsupported:
        raise
    except Exception as e:
        first = str(e).splitlines()[0] if str(e) else type(e).__name__
        raise Unsupported(f"{name} failed on the traced (symbolic) shapes: {type(e).__name__}: {first}") from None
    tensors = [result] if isinstance(result, torch.Tensor) else \
        [r for r in result if isinstance(r, torch.Tensor)] if isinstance(result, (tuple, list)) else []
    if tensors:
        device = device_str(tensors[0].device)
    return _record_result(tx, name, ir_args, ir_kwargs, result, device)


def _record_result(tx, name, ir_args, ir_kwargs, result, device) -> Var:
    op = f"torch::{name}"
    if result is None:
        tx.graph.call(op, ir_args, ir_kwargs, out=None, meta=tx.node_meta())
        return const(None)
    if isinstance(result, torch.Tensor):
        value = tx.graph.call(op, ir_args, ir_kwargs, out=meta_of(result, device), meta=tx.node_meta())
        return TensorVar(value, result, device)
    if isinstance(result, (tuple, list)) and result and all(isinstance(r, torch.Tensor) for r in result):
        values = tx.graph.call(op, ir_args, ir_kwargs, out=[meta_of(r, device) for r in result],
                               meta=tx.node_meta())
        items: list[Var] = [TensorVar(v, r, device) for v, r in zip(values, result)]
        if isinstance(result, list):
            return ListVar(items)
        return TupleVar(items, cls=type(result))
    if is_constant_value(result) and not isinstance(result, (int, float, bool)) or isinstance(result, torch.Size):
        return const(result)
    if isinstance(result, torch.SymInt):
        return const(result)
    if isinstance(result, (bool, int, float)):
        raise Unsupported(f"{name} returns a Python {type(result).__name__} computed from tensor data")
    raise Unsupported(f"{name} returns a {type(result).__name__}, which the graph cannot hold")


def scalar_type_of(value: Any) -> ScalarType:
    return ScalarType("bool" if isinstance(value, bool) else "int" if isinstance(value, int) else "float")


class TorchFnVar(Var):
    """A public torch callable (``torch.add``, ``F.gelu``, ``torch.Tensor.view``)."""

    def __init__(self, fn: Any, name: str, source=None):
        self.fn, self.name, self.source = fn, name, source

    def python_type(self):
        return type(self.fn)

    def identity(self):
        return self.fn

    def call(self, tx, args, kwargs):
        from fireclay_capture.variables.torch_names import CUDA_QUERY_GUARDS, TRACE_TIME_FUNCTIONS

        if self.fn in TRACE_TIME_FUNCTIONS:
            a = [_to_fake(x) for x in args]
            k = {n: _to_fake(x) for n, x in kwargs.items()}
            if self.fn not in CUDA_QUERY_GUARDS:
                return const(TRACE_TIME_FUNCTIONS[self.fn](*a, **k))
            try:
                result = const(self.fn(*a, **k))
            except (AssertionError, RuntimeError, ValueError) as e:  # no CUDA in this build or process
                raise ObservedException(type(e), str(e), args_known=e.args if is_constant_value(e.args) else None) \
                    from None
            for expression in CUDA_QUERY_GUARDS[self.fn](*a, **k):
                tx.guards.expression(expression)
            return result
        if self.name.startswith("Tensor.") and args and isinstance(args[0], TensorVar):
            return tensor_method(tx, args[0], self.name[len("Tensor."):], args[1:], kwargs)
        return record_call(tx, self.name, self.fn, args, kwargs)

    def getattr(self, tx, name):
        if isinstance(self.fn, torch._ops.OpOverloadPacket) and not name.startswith("_"):
            from fireclay_capture.sources import AttrSource
            try:
                overload = getattr(self.fn, name)  # torch.ops.aten.add.Tensor
            except AttributeError as e:
                raise ObservedException(AttributeError, str(e)) from None
            return tx.wrap(overload, AttrSource(self.source, name) if self.source is not None else None)
        return super().getattr(tx, name)

    def __repr__(self):
        return f"TorchFnVar({self.name})"

    def reconstruct(self, specs):
        return specs.output(self) if self.source is not None else ("const", self.fn)


def dict_or_fail(v: Var) -> DictVar:
    if not isinstance(v, DictVar):
        raise Unsupported(f"** of {v}")
    return v
