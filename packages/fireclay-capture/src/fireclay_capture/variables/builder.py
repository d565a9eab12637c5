"""``wrap``: turn a real Python value read from a source into a Var, installing the guards that
make the trace valid only while the value stays what the trace saw."""

from __future__ import annotations

import builtins
import contextlib
import dataclasses
import functools
import itertools
import logging
import math
import operator
import os
import sys
import types
from typing import Any

import torch

from fireclay_capture.controls import CaptureWrapper
from fireclay_capture.errors import Unsupported
from fireclay_capture.scan import associative_scan, is_torch_associative_scan
from fireclay_capture.sources import AttrSource, BuiltinItemSource, ItemSource, Source, clean_name
from fireclay_capture.variables.base import ConstVar, is_constant_value
from fireclay_capture.variables.containers import DictVar, ListVar, SetVar, TupleVar
from fireclay_capture.variables.function_modes import FunctionModeClassVar, known_function_mode
from fireclay_capture.variables.functions import (
    AutocastVar,
    BuiltinVar,
    CachedFunctionVar,
    GradModeVar,
    NullContextVar,
    PartialVar,
    UserFunctionVar,
    UserMethodVar,
)
from fireclay_capture.variables.library_calls import (
    AutogradFunctionApplyVar,
    NumpyUfuncVar,
    is_function_apply,
    is_numpy_ufunc,
)
from fireclay_capture.variables.objects import (
    ClassVar,
    EnvironVar,
    ModelOutputVar,
    ModuleVar,
    ObjectVar,
    PyModuleVar,
    is_model_output_class,
)
from fireclay_capture.variables.replayed import REPLAYED_FUNCTIONS, LoggerVar, ReplayedCallVar
from fireclay_capture.variables.tensor import TorchFnVar
from fireclay_capture.variables.torch_names import (
    TRACE_TIME_FUNCTIONS,
    TRACED_REPLACEMENTS,
    op_name_of_overload,
    public_torch_name,
)
from fireclay_capture.vmap import VmappedVar, VmapVar, is_vmap, made_by_vmap

_BUILTIN_MODULES = (builtins, operator, math)


def _is_builtin_callable(value: Any) -> bool:
    if isinstance(value, types.BuiltinFunctionType) and getattr(value, "__module__", None) in (
            "builtins", "_operator", "operator", "math", "itertools", "functools"):
        return True
    return isinstance(value, type) and value in _BUILTIN_TYPES


_BUILTIN_TYPES = {int, float, bool, str, tuple, list, dict, set, frozenset, range, enumerate, zip,
                  slice, type, reversed, map, filter, super, object, complex, bytes, isinstance,
                  itertools.repeat, itertools.chain, itertools.product, itertools.islice, itertools.pairwise,
                  itertools.accumulate, itertools.starmap}


def _is_numpy_number(value: Any) -> bool:
    numpy = sys.modules.get("numpy")
    return numpy is not None and isinstance(value, numpy.generic) and value.dtype.kind in "biuf"


def _is_cond(value: Any) -> bool:
    from fireclay_capture.cond import cond

    return value is cond or (value is getattr(torch, "cond", None) and value is not None)


def wrap(tx, value: Any, source: Source | None, *, weight: tuple[str, str] | None = None,
         qualname: str | None = None):
    """A Var for ``value``; with a source, also the guards that pin what the trace relies on."""
    g = tx.guards if source is not None else None

    if isinstance(value, torch.Tensor):
        if source is None:
            raise Unsupported("a tensor reached from a place the capture cannot re-read "
                              "(a global of a library module?)")
        return tx.tensor_input(value, source, weight)
    if is_constant_value(value):
        if g is not None:
            if isinstance(value, torch.dtype):
                g.id_is(source, value)
            else:
                g.equals(source, value)
        return ConstVar(value, source)
    if _is_numpy_number(value):
        # A NumPy scalar (VITS multiplies lengths by ``np.prod(...)``): the Python number it holds,
        # which tensors treat alike (as NumpyUfuncVar's results), pinned by its type and value.
        if g is not None:
            g.equals(source, value)  # its NumPy type and its value
        return ConstVar(value.item(), source)
    if value is os.environ:
        return EnvironVar()
    if isinstance(value, (torch._ops.OpOverloadPacket, torch._ops.OpOverload)):
        _guard_id(g, source, value)
        return TorchFnVar(value, op_name_of_overload(value), source)
    allowed = getattr(value, "_fireclay_allowed_op", None) if callable(value) else None
    if isinstance(allowed, str):
        _guard_id(g, source, value)
        return TorchFnVar(value, allowed, source)
    if _is_cond(value):
        from fireclay_capture.cond import CondVar

        _guard_id(g, source, value)
        return CondVar(value, source)
    if is_vmap(value):
        _guard_id(g, source, value)
        return VmapVar(value, source)
    vmapped = made_by_vmap(value)
    if vmapped is not None:
        # The function torch.vmap made (its closure never changes): pinned by identity, with
        # the function it maps reached through its closure.
        _guard_id(g, source, value)
        index = value.__code__.co_freevars.index("func")
        func_source = AttrSource(ItemSource(AttrSource(source, "__closure__"), index), "cell_contents") \
            if source is not None else None
        return VmappedVar(wrap(tx, vmapped["func"], func_source), vmapped["in_dims"], vmapped["out_dims"],
                          randomness=vmapped["randomness"], chunk_size=vmapped["chunk_size"])
    mode = known_function_mode(value)
    if mode is not None:
        _guard_id(g, source, value)
        return FunctionModeClassVar(value, mode, source)
    if is_torch_associative_scan(value):  # traced as plain tensor ops (scan.py says why)
        _guard_id(g, source, value)
        return wrap(tx, associative_scan, None)
    if isinstance(value, functools._lru_cache_wrapper) and isinstance(getattr(value, "__wrapped__", None),
                                                                      types.FunctionType):
        _guard_id(g, source, value)
        return CachedFunctionVar(value, wrap(tx, value.__wrapped__, None))
    captured = _captured_target(value)
    if captured is not None:
        # A captured function called from captured code: inline what it wraps.
        return wrap(tx, captured, AttrSource(source, "_target") if source is not None else None)
    if isinstance(value, torch.nn.Module):
        if g is not None:
            g.id_is(source, value)
        if qualname is None:
            qualname = tx.qualname_of(value)
        if qualname is None:
            qualname = clean_name(source.name_hint() if source else "module")
        return ModuleVar(value, source, qualname)
    if source is not None and _is_mutable_container(value):
        known = tx.aliases.known(value, source)
        if known is not None:
            return known
    if type(value) is list or type(value) is tuple or (isinstance(value, tuple) and hasattr(type(value), "_fields")):
        if g is not None:
            g.length(source, type(value), len(value))
        items = [wrap(tx, v, ItemSource(source, i) if source else None) for i, v in enumerate(value)]
        if type(value) is list:
            return _remember(tx, value, ListVar(items, source))
        return TupleVar(items, source, cls=type(value))
    if type(value) is dict or type(value).__name__ == "OrderedDict" and isinstance(value, dict):
        keys = list(value)
        if not all(isinstance(k, (str, int)) and not isinstance(k, bool) for k in keys):
            raise Unsupported("a dict whose keys are not strings or ints")
        if g is not None:
            g.dict_keys(source, type(value), keys)
        return _remember(tx, value, DictVar({k: wrap(tx, v, ItemSource(source, k) if source else None)
                                             for k, v in value.items()}, source, cls=type(value)))
    if type(value) is set and all(is_constant_value(v) for v in value):
        # A set of constants: pinned with its iteration order, which the trace follows.
        real = value.copy()
        if list(real) != list(value):
            raise Unsupported("a set whose copy iterates in another order")
        if g is not None:
            g.dict_keys(source, set, list(value))
        return SetVar([ConstVar(v) for v in real], source, real=real)
    if isinstance(value, logging.Logger):
        _guard_id(g, source, value)
        return LoggerVar(value, source)
    if value in REPLAYED_FUNCTIONS if _hashable(value) else False:
        _guard_id(g, source, value)
        return ReplayedCallVar(value, source)
    if value in TRACED_REPLACEMENTS if _hashable(value) else False:
        _guard_id(g, source, value)
        return UserFunctionVar(TRACED_REPLACEMENTS[value], None)
    if isinstance(value, torch.jit.ScriptFunction) and isinstance(_scripted_source(value), types.FunctionType):
        # ``@torch.jit.script`` keeps the Python function it compiled: traced like any other
        # (the scripted one is a C callable no graph holds), as TorchDynamo does.
        _guard_id(g, source, value)
        return UserFunctionVar(_scripted_source(value), None)
    if value in TRACE_TIME_FUNCTIONS if _hashable(value) else False:
        return TorchFnVar(value, public_torch_name(value) or str(getattr(value, "__name__", "trace_time")), source)
    if _hashable(value) and not isinstance(value, type) and _has_builtin_rule(value):
        _guard_id(g, source, value)
        return BuiltinVar(value, source)
    grad_mode = _grad_mode_class(value)
    if grad_mode is not None:
        _guard_id(g, source, value)
        return grad_mode
    torch_name = _torch_op_name(value)
    if torch_name is not None:
        _guard_id(g, source, value)
        return TorchFnVar(value, torch_name, source)
    if isinstance(value, types.FunctionType):
        if value.__closure__ and g is not None and source is not None and not hasattr(value, "_fireclay_eager"):
            # A closure is made anew each time its enclosing code runs: pin its code and globals,
            # not the object (its cells are read, and guarded, through this source).
            g.type_is(source, types.FunctionType)
            g.id_is(AttrSource(source, "__code__"), value.__code__)
            g.id_is(AttrSource(source, "__globals__"), value.__globals__)
            g.equals(AttrSource(source, "__name__"), value.__name__)
        else:
            _guard_id(g, source, value)
        return UserFunctionVar(value, source)
    if is_function_apply(value):  # a bound method, or from torch 2.14 on a bound builtin
        cls_var = wrap(tx, value.__self__, AttrSource(source, "__self__") if source else None)
        return AutogradFunctionApplyVar(value.__self__, cls_var, source)
    if is_numpy_ufunc(value):
        _guard_id(g, source, value)
        return NumpyUfuncVar(value, source)
    if isinstance(value, types.MethodType):
        _guard_id(g, source, value.__func__ if source is None else None)
        fn = wrap(tx, value.__func__, AttrSource(source, "__func__") if source else None)
        owner = wrap(tx, value.__self__, AttrSource(source, "__self__") if source else None)
        return UserMethodVar(fn, owner, source)
    if isinstance(value, types.ModuleType):
        _guard_id(g, source, value)
        return PyModuleVar(value, source)
    if _is_builtin_callable(value):
        _guard_id(g, source, value)
        return BuiltinVar(value, source)
    if isinstance(value, functools.partial):
        _guard_id(g, source, value)
        return PartialVar(wrap(tx, value.func, None), [wrap(tx, a, None) for a in value.args],
                          {k: wrap(tx, v, None) for k, v in value.keywords.items()})
    tensor_method = _tensor_method_name(value)
    if tensor_method is not None:
        _guard_id(g, source, value)
        return TorchFnVar(value, f"Tensor.{tensor_method}", source)
    if isinstance(value, type):
        _guard_id(g, source, value)
        if value is contextlib.nullcontext:
            return BuiltinVar(value, source)
        if value in _BUILTIN_TYPES or value.__module__ == "builtins":
            return BuiltinVar(value, source)
        return ClassVar(value, source)
    if callable(value) and not isinstance(value, type):
        if isinstance(value, types.BuiltinFunctionType):
            _guard_id(g, source, value)
            return BuiltinVar(value, source)
    if isinstance(value, contextlib.nullcontext):
        return NullContextVar(ConstVar(value.enter_result))
    if source is None:
        raise Unsupported(f"a {type(value).__name__} object reached without a way to re-read it")
    known = tx.aliases.known(value, source)
    if known is not None:
        return known
    if is_model_output_class(type(value)) and dataclasses.is_dataclass(value) and _attributes_match_items(value):
        return _remember(tx, value, _existing_model_output(tx, value, source))
    if g is not None:
        g.type_is(source, type(value))
    if dataclasses.is_dataclass(value) or hasattr(value, "__dict__"):
        return _remember(tx, value, ObjectVar(value, source))
    raise Unsupported(f"a value of type {type(value).__qualname__}")


def _attributes_match_items(value: Any) -> bool:
    """Whether a ModelOutput's mapping holds its fields in declaration order, each entry the
    attribute itself, and its other fields are None: what a ModelOutput built in the trace is.
    (Setting a present field back to None keeps its entry: such an object stays an ObjectVar.)"""
    keys = list(dict.keys(value))
    names = [f.name for f in dataclasses.fields(value)]
    return keys == [n for n in names if n in keys] and all(
        getattr(value, n, None) is (dict.__getitem__(value, n) if n in keys else None) for n in names)


def _existing_model_output(tx, value: Any, source: Source) -> ModelOutputVar:
    """A ModelOutput made outside the trace (before a graph break: Qwen3.5-MoE re-wraps its
    language model's output with ``**outputs``), read as one made in the trace: pinned by its
    keys, its entries read through the dict's own ``__getitem__`` and guarded to be its
    attributes, its absent fields by their None attributes."""
    keys = list(dict.keys(value))
    tx.guards.dict_keys(source, type(value), keys)
    fields: dict[str, Any] = {}
    for f in dataclasses.fields(value):
        attr = AttrSource(source, f.name)
        if f.name in keys:
            item = BuiltinItemSource(source, f.name)
            tx.guards.same_object(attr, item)
            fields[f.name] = wrap(tx, dict.__getitem__(value, f.name), item)
        else:
            tx.guards.equals(attr, None)
            fields[f.name] = ConstVar(None)
    return ModelOutputVar(type(value), fields, source)


def _is_mutable_container(value: Any) -> bool:
    return type(value) is list or isinstance(value, dict) and (
        type(value) is dict or type(value).__name__ == "OrderedDict")


def _remember(tx, value: Any, var):
    if var.source is not None:
        tx.aliases.remember(value, var)
    return var


def _torch_op_name(value: Any) -> str | None:
    """The op name of a public torch callable (recorded as one node rather than inlined)."""
    if isinstance(value, type) or not callable(value):
        return None
    module = getattr(value, "__module__", None) or ""
    if not (module.startswith("torch") or isinstance(value, types.BuiltinFunctionType)):
        return None
    name = public_torch_name(value)
    if name is not None and (name.startswith("torch.") or name.startswith("Tensor.")):
        return name
    return None


def wrap_container(tx, value: Any, source: Source | None):
    """A dict/list/tuple subclass instance viewed as the plain container (guarded like one)."""
    g = tx.guards if source is not None else None
    if isinstance(value, dict):
        keys = list(dict.keys(value))
        if not all(isinstance(k, (str, int)) and not isinstance(k, bool) for k in keys):
            raise Unsupported("a dict whose keys are not strings or ints")
        if g is not None:
            g.dict_keys(source, type(value), keys)
        return DictVar({k: wrap(tx, dict.__getitem__(value, k), BuiltinItemSource(source, k, dict) if source else None)
                        for k in keys}, source, cls=type(value))
    if isinstance(value, (list, tuple)):
        if g is not None:
            g.length(source, type(value), len(value))
        base: type = list if isinstance(value, list) else tuple
        iterate: Any = base.__dict__["__iter__"]  # the builtin's, not a subclass's
        items = [wrap(tx, v, BuiltinItemSource(source, i, base) if source else None)
                 for i, v in enumerate(iterate(value))]
        return ListVar(items, source) if isinstance(value, list) else TupleVar(items, source)
    raise Unsupported(f"a {type(value).__name__} seen as a builtin container")


def _captured_target(value: Any) -> Any:
    return value.captured_target if isinstance(value, CaptureWrapper) else None


def _has_builtin_rule(value: Any) -> bool:
    from fireclay_capture.builtins import BUILTIN_RULES

    return value in BUILTIN_RULES


def _hashable(value: Any) -> bool:
    try:
        hash(value)
        return True
    except TypeError:
        return False


def _scripted_source(fn: Any) -> Any:
    return getattr(fn, "_torchdynamo_inline", None)  # set by torch.jit.script and torch.jit.trace


def _guard_id(g, source, value) -> None:
    if g is not None and source is not None and value is not None:
        g.id_is(source, value)


def _grad_mode_class(value: Any):
    if value is torch.no_grad:
        return _GradModeFactory(False)
    if value is torch.enable_grad:
        return _GradModeFactory(True)
    if value is torch.set_grad_enabled:
        return _GradModeFactory(None)
    if value is torch.autocast or getattr(value, "__name__", None) == "autocast" and isinstance(value, type) \
            and issubclass(value, torch.autocast):
        return _AutocastFactory(value)
    return None


class _GradModeFactory(BuiltinVar):
    def __init__(self, enabled: bool | None):
        super().__init__(torch.set_grad_enabled if enabled is None else
                         (torch.enable_grad if enabled else torch.no_grad))
        self.enabled = enabled

    def call(self, tx, args, kwargs):
        if self.enabled is None:
            mode = bool((args[0] if args else kwargs["mode"]).as_python_constant())
            # set_grad_enabled(b) also acts at once when used as a plain call.
            var = GradModeVar(mode)
            var.prior = torch.is_grad_enabled()
            tx.set_grad_enabled(mode)
            return var
        return GradModeVar(self.enabled)


class _AutocastFactory(BuiltinVar):
    """torch.autocast / torch.amp.autocast (device first), torch.{cpu,cuda}.amp.autocast."""

    def __init__(self, cls: type = torch.autocast):
        super().__init__(cls)
        module = getattr(cls, "__module__", "")
        self.implied_device = "cuda" if ".cuda." in module else "cpu" if ".cpu." in module else None

    def call(self, tx, args, kwargs):
        a = [x.as_python_constant() for x in args]
        k = {n: x.as_python_constant() for n, x in kwargs.items()}
        if self.implied_device is None:
            names = ["device_type", "dtype", "enabled", "cache_enabled"]
        else:
            k.setdefault("device_type", self.implied_device)
            names = ["enabled", "dtype", "cache_enabled"]
        k.update(zip(names, a))
        return AutocastVar(k["device_type"], k.get("dtype"), bool(k.get("enabled", True)),
                           k.get("cache_enabled"))


def _tensor_method_name(value: Any) -> str | None:
    name = getattr(value, "__name__", None)
    if name and getattr(torch.Tensor, name, None) is value:
        return name
    return None
