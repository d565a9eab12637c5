"""Objects: nn.Modules, Python modules, classes, user objects that exist outside the trace, and
objects created inside it (dataclasses, plain classes, Hugging Face ModelOutputs)."""

from __future__ import annotations

import collections.abc
import contextlib
import dataclasses
import functools
import inspect
import os
import types
from typing import Any

import torch
from torch.nn.modules import module as _module_module

from fireclay_capture.errors import ObservedException, Unsupported
from fireclay_capture.sources import AttrSource, module_member
from fireclay_capture.variables.base import ConstVar, Var, const, is_constant_value
from fireclay_capture.variables.containers import DictVar, TupleVar
from fireclay_capture.variables.functions import PartialVar, UserFunctionVar, UserMethodVar


def _class_attribute(tx, owner_var: Var, obj_type: type, name: str, source) -> Var | None:
    """Look ``name`` up on the class the way the instance would; None if it is not there."""
    try:
        attr = inspect.getattr_static(obj_type, name)
    except AttributeError:
        return None
    if isinstance(attr, staticmethod):
        return tx.wrap(attr.__func__, None)
    if isinstance(attr, classmethod):
        return UserMethodVar(tx.wrap(attr.__func__, None), ClassVar(obj_type))
    if isinstance(attr, property):
        if attr.fget is None:
            raise Unsupported(f"property {name!r} has no getter")
        return tx.inline_call(UserFunctionVar(attr.fget), [owner_var], {})
    if isinstance(attr, types.FunctionType):
        return UserMethodVar(UserFunctionVar(attr), owner_var)
    if hasattr(attr, "__get__") and not isinstance(attr, (int, float, str, tuple, type)):
        raise Unsupported(f"descriptor {name!r} of {obj_type.__name__}")
    return tx.wrap(attr, source)


def _hooks_of(module: torch.nn.Module) -> bool:
    module_mod = _module_module  # torch's module of nn.Module (its global hook tables); read per call
    return bool(module._forward_hooks or module._forward_pre_hooks or module._backward_hooks
                or getattr(module, "_backward_pre_hooks", None)
                or module_mod._global_forward_hooks or module_mod._global_forward_pre_hooks
                or module_mod._global_backward_hooks)


_MODULE_ITERATORS = ("parameters", "buffers", "children", "modules", "named_parameters",
                     "named_buffers", "named_children", "named_modules")


class ModuleVar(Var):
    """An ``nn.Module`` instance: attributes, parameters and buffers (lifted as graph inputs),
    submodules; calling it inlines its ``forward``."""

    def __init__(self, module: torch.nn.Module, source, qualname: str):
        self.module = module
        self.source = source
        self.qualname = qualname

    def python_type(self):
        return type(self.module)

    def identity(self):
        return self.module

    def _child_name(self, name: str) -> str:
        return f"{self.qualname}.{name}" if self.qualname else name

    def getattr(self, tx, name):
        m = self.module
        src = self.source
        if name == "__class__":
            return ClassVar(type(m))
        if src is None:  # made inside the trace: its plain attributes are constants of the trace
            if name in m.__dict__:
                return tx.wrap(m.__dict__[name], None)
            found = _class_attribute(tx, self, type(m), name, None)
            if found is not None:
                return found
            raise ObservedException(AttributeError, f"'{type(m).__name__}' object has no attribute {name!r}")
        written = tx.read_attr(m, name)
        if written is not None:
            return written
        if name in m.__dict__:
            return tx.wrap(m.__dict__[name], AttrSource(src, name))
        if name in m._parameters:
            return tx.wrap(m._parameters[name], module_member(src, "_parameters", name),
                        weight=("parameter", self._child_name(name)))
        if name in m._buffers:
            return tx.wrap(m._buffers[name], module_member(src, "_buffers", name),
                        weight=("buffer", self._child_name(name)))
        if name in m._modules:
            child = m._modules[name]
            return tx.wrap(child, module_member(src, "_modules", name), qualname=self._child_name(name))
        if name in _MODULE_ITERATORS and getattr(type(m), name) is getattr(torch.nn.Module, name):
            from fireclay_capture.variables.containers import ContainerMethodVar

            return ContainerMethodVar(self, name)
        found = _class_attribute(tx, self, type(m), name, AttrSource(src, name))
        if found is not None:
            return found
        if name == "__class__":
            return ClassVar(type(m))
        raise ObservedException(AttributeError, f"'{type(m).__name__}' object has no attribute {name!r}")

    def call(self, tx, args, kwargs):
        if _hooks_of(self.module):
            raise Unsupported(f"module {self.qualname or type(self.module).__name__} has hooks")
        if self.source is not None:
            # Registering a hook later must re-capture (the trace inlined forward without it).
            tx.guards.no_hooks(self.source)
        forward = self.getattr(tx, "forward")
        with tx.in_module(self.qualname, type(self.module).__name__):
            return forward.call(tx, args, kwargs)

    def children(self, tx) -> list[Var]:
        return [self.getattr(tx, name) for name in self.module._modules]

    def unpack(self, tx):
        m = self.module
        if isinstance(m, (torch.nn.ModuleList, torch.nn.Sequential)):
            return self.children(tx)
        if isinstance(m, torch.nn.ModuleDict):
            return [const(k) for k in m._modules]
        if isinstance(m, torch.nn.ParameterList):
            return [self.getattr(tx, k) for k in m._parameters]
        raise Unsupported(f"iterating over module {type(m).__name__}")

    def truth(self, tx):
        return len(self.module._modules) > 0 if isinstance(self.module, (torch.nn.ModuleList,)) else True

    def getitem(self, tx, key):
        m = self.module
        k = key.as_python_constant()
        if isinstance(m, torch.nn.ModuleDict):
            return self.getattr(tx, k)
        if isinstance(m, (torch.nn.ModuleList, torch.nn.Sequential, torch.nn.ParameterList)):
            names = list(m._modules) if not isinstance(m, torch.nn.ParameterList) else list(m._parameters)
            if isinstance(k, slice):
                return TupleVar([self.getattr(tx, n) for n in names[k]])
            return self.getattr(tx, names[k])
        raise Unsupported(f"indexing module {type(m).__name__}")

    def method(self, tx, name, args, kwargs):
        if args or kwargs:
            raise Unsupported(f"Module.{name}() with arguments")
        return self._iterate(tx, name)

    def _iterate(self, tx, name: str) -> Var:
        m = self.module
        if name in ("children", "named_children"):
            pairs = [(k, self.getattr(tx, k)) for k in m._modules if m._modules[k] is not None]
        elif name in ("parameters", "named_parameters", "buffers", "named_buffers"):
            table = "_parameters" if "param" in name else "_buffers"
            pairs = []
            for prefix, sub in m.named_modules():
                owner = self._descend(tx, prefix)
                for k, v in getattr(sub, table).items():
                    if v is not None:
                        pairs.append((f"{prefix}.{k}" if prefix else k, owner.getattr(tx, k)))
        else:
            pairs = [(prefix, self._descend(tx, prefix)) for prefix, _ in m.named_modules()]
        if name.startswith("named_"):
            return TupleVar([TupleVar([const(k), v]) for k, v in pairs])
        return TupleVar([v for _, v in pairs])

    def _descend(self, tx, dotted: str) -> Var:
        v: Var = self
        for part in filter(None, dotted.split(".")):
            v = v.getattr(tx, part)
        return v

    def __repr__(self):
        return f"ModuleVar({self.qualname or type(self.module).__name__})"


class PyModuleVar(Var):
    """A Python module (``torch``, ``math``, ``torch.nn.functional``, a user module)."""

    TRUSTED = ("torch", "math", "operator", "builtins", "functools", "itertools", "collections",
               "typing", "dataclasses", "numbers", "types", "warnings", "inspect", "enum")

    def __init__(self, module: types.ModuleType, source=None):
        self.module = module
        self.source = source

    def identity(self):
        return self.module

    def python_type(self):
        return types.ModuleType

    def getattr(self, tx, name):
        try:
            value = getattr(self.module, name)
        except AttributeError:
            raise ObservedException(AttributeError, f"module {self.module.__name__!r} has no attribute {name!r}") from None
        root = self.module.__name__.split(".")[0]
        # Library modules are assumed not to be monkey-patched mid-run: no guards below them.
        source = None if root in self.TRUSTED else (AttrSource(self.source, name) if self.source else None)
        return tx.wrap(value, source)

    def __repr__(self):
        return f"module {self.module.__name__}"


class ClassVar(Var):
    """A class: calling it builds an object (namedtuple, dataclass, plain class, ModelOutput)."""

    def __init__(self, cls: type, source=None):
        self.cls = cls
        self.source = source

    def python_type(self):
        return type(self.cls)

    def identity(self):
        return self.cls

    def as_python_constant(self):
        return self.cls  # a class is pinned by an identity guard (or by its instance's type guard)

    def getattr(self, tx, name):
        from fireclay_capture.variables.library_calls import AutogradFunctionApplyVar, is_function_apply

        try:
            attr = inspect.getattr_static(self.cls, name)
        except AttributeError:
            raise ObservedException(AttributeError, f"type object {self.cls.__name__!r} has no attribute {name!r}") from None
        if name == "apply" and is_function_apply(getattr(self.cls, name)):
            return AutogradFunctionApplyVar(self.cls, self)
        if isinstance(attr, classmethod):
            return UserMethodVar(tx.wrap(attr.__func__, None), self)
        if isinstance(attr, staticmethod):
            return tx.wrap(attr.__func__, None)
        if isinstance(attr, types.FunctionType):
            return UserFunctionVar(attr)
        return tx.wrap(getattr(self.cls, name), AttrSource(self.source, name) if self.source else None)

    def call(self, tx, args, kwargs):
        cls = self.cls
        if cls in (torch.no_grad, torch.enable_grad) and not args and not kwargs:
            # e.g. torch's function decorators re-create their context manager on each call
            from fireclay_capture.variables.functions import GradModeVar

            return GradModeVar(cls is torch.enable_grad)
        if is_model_output_class(cls):
            return ModelOutputVar.construct(tx, cls, args, kwargs)
        if issubclass(cls, tuple) and hasattr(cls, "_fields"):
            names = cls._fields
            bound = dict(zip(names, args))
            bound.update(kwargs)
            defaults = getattr(cls, "_field_defaults", {})
            items = []
            for n in names:
                if n in bound:
                    items.append(bound[n])
                elif n in defaults:
                    items.append(const(defaults[n]))
                else:
                    raise Unsupported(f"{cls.__name__}() missing argument {n!r}")
            return TupleVar(items, cls=cls)
        if issubclass(cls, torch.nn.Module):
            return _module_made_in_trace(cls, args, kwargs)
        if cls is torch.device:
            return _device_made_in_trace(args, kwargs)
        if issubclass(cls, BaseException):
            from fireclay_capture.variables.exceptions import make_exception

            return make_exception(cls, args, kwargs)
        if issubclass(cls, contextlib._GeneratorContextManagerBase):
            # Its generator runs in steps around the block: it cannot be unrolled at trace time.
            raise Unsupported(f"a generator-based context manager ({cls.__name__})")
        if cls is functools.partial:
            return PartialVar(args[0], list(args[1:]), dict(kwargs))
        if cls is collections.OrderedDict:  # timm's feature extractors collect their outputs in one
            made = tx.call_builtin(dict, args, kwargs)  # the same items in the same order
            made.cls = cls
            return made
        init = inspect.getattr_static(cls, "__init__", None)
        new = inspect.getattr_static(cls, "__new__", None)
        if init is object.__init__ and new is object.__new__:
            if args or kwargs:
                raise Unsupported(f"{cls.__qualname__}() takes no arguments")
            return NewObjectVar(cls)
        if new is not object.__new__ or not isinstance(init, types.FunctionType):
            raise Unsupported(f"creating an instance of {cls.__qualname__} (custom __new__ or C __init__)")
        obj = NewObjectVar(cls)
        tx.inline_call(UserFunctionVar(init), [obj, *args], kwargs)
        return obj

    def reconstruct(self, specs):
        # Without a source (a library's class, as torch.device, or a type() of the trace) the class
        # itself crosses a break: it is the same object in plain Python
        return specs.output(self) if self.source is not None else ("const", self.cls)

    def __repr__(self):
        return f"class {self.cls.__qualname__}"


def _module_made_in_trace(cls: type, args: list[Var], kwargs: dict[str, Var]) -> ModuleVar:
    """``nn.MaxPool1d(k)(x)`` written inside forward: a torch.nn module without parameters or
    buffers, built from constants, is built for real at trace time (its constructor only stores
    its settings) and its forward inlined like any module's, as TorchDynamo does. A module with
    weights made in forward would get new random weights on every call: that stays a break. A
    module class of a library or user counts when it keeps nn.Module's constructor (an activation
    whose forward is all it adds): then building it cannot have effects the trace would skip."""
    if not (cls.__module__ or "").startswith("torch.nn.modules.") and inspect.getattr_static(cls, "__init__") is not torch.nn.Module.__init__:
        raise Unsupported(f"creating a module ({cls.__name__}) inside the captured function")
    if not all(v.is_constant() for v in [*args, *kwargs.values()]):
        raise Unsupported(f"creating a module ({cls.__name__}) inside the captured function from values "
                          "that are not constants")
    a = [v.as_python_constant() for v in args]
    k = {n: v.as_python_constant() for n, v in kwargs.items()}
    try:
        with torch.device("meta"):  # a module with weights is refused below: allocate none
            probe = cls(*a, **k)
    except Exception as e:
        raise ObservedException(type(e), str(e)) from None
    if any(True for _ in probe.parameters()) or any(True for _ in probe.buffers()) \
            or any(isinstance(v, torch.Tensor) for v in vars(probe).values()):
        raise Unsupported(f"creating a module with parameters or buffers ({cls.__name__}) inside the "
                          "captured function")
    return ModuleVar(cls(*a, **k), None, "")


def _device_made_in_trace(args: list[Var], kwargs: dict[str, Var]) -> ConstVar:
    """``torch.device("cuda", 0)`` or ``torch.device(x.device.type, index)`` written inside
    forward: an immutable value that depends on its arguments alone, so it is built for real at
    trace time, as TorchDynamo folds it; the constants it is built from carry whatever guards they
    need. torch also takes the index from a 0-d tensor: that is data, and stays a break. An
    invalid device ("nonsense") raises in the traced code as it would eagerly."""
    values = [*args, *kwargs.values()]
    if not all(v.is_constant() for v in values):
        raise Unsupported("torch.device() of values that are not constants (an index held in a tensor?)")
    a = [v.as_python_constant() for v in args]
    k = {n: v.as_python_constant() for n, v in kwargs.items()}
    if any(isinstance(v, (torch.SymInt, torch.SymFloat, torch.SymBool)) for v in [*a, *k.values()]):
        raise Unsupported("torch.device() of a symbolic size")
    try:
        return const(torch.device(*a, **k))
    except Exception as e:
        raise ObservedException(type(e), str(e), args_known=e.args if is_constant_value(e.args) else None) \
            from None


def is_model_output_class(cls: type) -> bool:
    return any(k.__name__ == "ModelOutput" and k.__module__.startswith("transformers") for k in cls.__mro__)


class ObjectVar(Var):
    """A user object that exists outside the trace: attributes are read (and guarded), never
    written."""

    def __init__(self, obj: Any, source):
        self.obj = obj
        self.source = source

    def python_type(self):
        return type(self.obj)

    def identity(self):
        return self.obj

    def getattr(self, tx, name):
        if name == "__class__":
            return ClassVar(type(self.obj))
        written = tx.read_attr(self.obj, name)
        if written is not None:
            from fireclay_capture.side_effects import DELETED

            if written is DELETED:
                raise ObservedException(AttributeError, f"'{type(self.obj).__name__}' object has no attribute {name!r}")
            return written
        hook = _python_attribute_hook(type(self.obj), name)
        if hook == "__getattribute__":
            return self._real_attribute(tx, name)
        d = getattr(self.obj, "__dict__", None)
        if d is not None and name in d:
            return tx.wrap(d[name], AttrSource(self.source, name) if self.source else None)
        found = _class_attribute(tx, self, type(self.obj), name,
                                 AttrSource(self.source, name) if self.source else None)
        if found is not None:
            return found
        if hook == "__getattr__":
            return self._real_attribute(tx, name)
        raise ObservedException(AttributeError, f"'{type(self.obj).__name__}' object has no attribute {name!r}")

    def call(self, tx, args, kwargs):
        return self.getattr(tx, "__call__").call(tx, args, kwargs)

    def _real_attribute(self, tx, name: str) -> Var:
        """An attribute the class computes in Python (``__getattribute__``/``__getattr__``, e.g. a
        transformers config's attribute_map aliases): read for real, and guarded through its
        source, which reads it the same way. Methods are still inlined from the class."""
        if self.source is None:
            raise Unsupported(f"attribute {name!r} of a {type(self.obj).__name__}, which computes its attributes")
        try:
            value = getattr(self.obj, name)
        except AttributeError as e:
            raise ObservedException(AttributeError, str(e)) from None
        if isinstance(value, types.MethodType) and value.__self__ is self.obj:
            found = _class_attribute(tx, self, type(self.obj), name, None)
            if found is not None:
                return found
        return tx.wrap(value, AttrSource(self.source, name))

    def _dunder(self, tx, name: str) -> Var | None:
        fn = inspect.getattr_static(type(self.obj), name, None)
        # collections.abc mixins answer through try/except; their own __iter__/__getitem__ do.
        if isinstance(fn, types.FunctionType) and fn.__module__ != "collections.abc":
            return UserMethodVar(UserFunctionVar(fn), self)
        return None

    def contains(self, tx, item: Var) -> bool | None:
        method = self._dunder(tx, "__contains__")
        if method is not None:
            return method.call(tx, [item], {}).truth(tx)
        return None

    def getitem(self, tx, key):
        method = self._dunder(tx, "__getitem__")
        if method is not None:
            return method.call(tx, [key], {})
        if isinstance(self.obj, (dict, list, tuple)):
            return self.builtin_view(tx).getitem(tx, key)
        return super().getitem(tx, key)

    def unpack(self, tx):
        method = self._dunder(tx, "__iter__")
        if method is not None:
            return method.call(tx, [], {}).unpack(tx)
        if isinstance(self.obj, (dict, list, tuple)):
            return self.builtin_view(tx).unpack(tx)
        if _iterates_as_sequence(type(self.obj)):
            return _sequence_items(tx, self)
        return super().unpack(tx)

    def builtin_view(self, tx) -> Var:
        """The object seen as the builtin container it subclasses (for ``super().get(...)`` and
        other C methods): its items wrapped with sources and guarded."""
        return tx.wrap_container(self.obj, self.source)

    def __repr__(self):
        return f"ObjectVar({type(self.obj).__name__})"


class NewObjectVar(Var):
    """An instance of a user class created inside the trace; its attributes are Vars."""

    def __init__(self, cls: type):
        self.cls = cls
        self.attrs: dict[str, Var] = {}
        self.slots = slot_names(cls)

    def python_type(self):
        return self.cls

    def getattr(self, tx, name):
        if name in self.attrs:
            return self.attrs[name]
        if name == "__class__":
            return ClassVar(self.cls)
        if name in (self.slots or ()) or _is_slot_of(self.cls, name):
            raise ObservedException(AttributeError, f"'{self.cls.__name__}' object has no attribute {name!r}")
        found = _class_attribute(tx, self, self.cls, name, None)
        if found is not None:
            return found
        raise ObservedException(AttributeError, f"'{self.cls.__name__}' object has no attribute {name!r}",
                                certain=_python_attribute_hook(self.cls, name) is None)

    def call(self, tx, args, kwargs):
        return self.getattr(tx, "__call__").call(tx, args, kwargs)

    def setitem(self, tx, key, value):
        method = self._dunder("__setitem__")  # e.g. UserDict's, which writes self.data
        if method is None:
            return super().setitem(tx, key, value)
        method.call(tx, [key, value], {})

    def delitem(self, tx, key):
        method = self._dunder("__delitem__")
        if method is None:
            raise Unsupported(f"deleting an item of {self}")
        method.call(tx, [key], {})

    def _dunder(self, name: str) -> Var | None:
        fn = inspect.getattr_static(self.cls, name, None)
        return UserMethodVar(UserFunctionVar(fn), self) if isinstance(fn, types.FunctionType) else None

    def getitem(self, tx, key):
        method = self._dunder("__getitem__")
        if method is None:
            return super().getitem(tx, key)
        return method.call(tx, [key], {})

    def contains(self, tx, item: Var) -> bool | None:
        method: Any = self._dunder("__contains__")  # a UserMethodVar when found
        if method is None or method.fn.fn.__module__ == "collections.abc":
            return None
        return method.call(tx, [item], {}).truth(tx)

    def unpack(self, tx):
        method = self._dunder("__iter__")
        if method is None:
            return super().unpack(tx)
        if _iterates_as_sequence(self.cls):
            return _sequence_items(tx, self)
        return method.call(tx, [], {}).unpack(tx)

    def setattr(self, tx, name: str, value: Var) -> None:
        prop = inspect.getattr_static(self.cls, name, None)
        if isinstance(prop, property) and prop.fset is not None:
            tx.inline_call(UserFunctionVar(prop.fset), [self, value], {})
            return
        if self.slots is not None and name not in self.slots:
            raise ObservedException(AttributeError, f"'{self.cls.__name__}' object has no attribute {name!r} "
                                                    "(it has __slots__ and no __dict__)")
        if not _is_slot_of(self.cls, name) and _class_descriptor_sets(self.cls, name):
            raise Unsupported(f"setting {name!r} of {self.cls.__qualname__}, a data descriptor of its class")
        tx.note_mutation(self)
        self.attrs[name] = value

    def __repr__(self):
        return f"NewObjectVar({self.cls.__name__})"


def _python_attribute_hook(cls: type, name: str) -> str | None:
    """Which attribute hook written in Python decides ``name`` on instances of ``cls``, if any."""
    if name.startswith("__") and name.endswith("__"):
        return None
    for hook in ("__getattribute__", "__getattr__"):
        if isinstance(inspect.getattr_static(cls, hook, None), types.FunctionType):
            return hook
    return None


def _iterates_as_sequence(cls: type) -> bool:
    return inspect.getattr_static(cls, "__iter__", None) is collections.abc.Sequence.__iter__ \
        and isinstance(inspect.getattr_static(cls, "__getitem__", None), types.FunctionType) \
        and isinstance(inspect.getattr_static(cls, "__len__", None), types.FunctionType)


def _sequence_items(tx, seq: Var) -> list[Var]:
    # Sequence's mixin __iter__ reads __getitem__ until IndexError; a Sequence's own __len__
    # says where that is, so the items are read by index (no exception crosses the trace).
    n = seq.call_method(tx, "__len__", [], {}).as_python_constant()
    return [seq.getitem(tx, const(i)) for i in range(n)]


def slot_names(cls: type) -> frozenset[str] | None:
    """The attributes an instance of ``cls`` can hold when every class of its MRO declares
    ``__slots__`` (so instances have no ``__dict__``); None when instances have a ``__dict__``."""
    names: set[str] = set()
    for klass in cls.__mro__[:-1]:
        own = klass.__dict__.get("__slots__")
        if own is None:
            return None
        own = (own,) if isinstance(own, str) else tuple(own)
        if "__dict__" in own:
            return None
        names.update(own)
    return frozenset(names)


def _is_slot_of(cls: type, name: str) -> bool:
    return isinstance(inspect.getattr_static(cls, name, None), types.MemberDescriptorType)


def _class_descriptor_sets(cls: type, name: str) -> bool:
    attr = inspect.getattr_static(cls, name, None)
    return attr is not None and hasattr(type(attr), "__set__")


class EnvironVar(Var):
    """``os.environ``: read at trace time. Libraries read switches from it; like TorchDynamo, the
    capture assumes the environment does not change while the program runs (no guards)."""

    def python_type(self):
        return type(os.environ)

    def getattr(self, tx, name):
        if name in ("get", "__contains__"):
            from fireclay_capture.variables.containers import ContainerMethodVar

            return ContainerMethodVar(self, name)
        raise Unsupported(f"os.environ.{name}")

    def method(self, tx, name, args, kwargs):
        key = args[0].as_python_constant()
        if name == "get":
            default = args[1].as_python_constant() if len(args) > 1 else None
            return const(os.environ.get(key, default))
        return const(key in os.environ)

    def getitem(self, tx, key):
        k = key.as_python_constant()
        if k not in os.environ:
            raise ObservedException(KeyError, k)
        return const(os.environ[k])

    def contains(self, tx, item):
        return item.as_python_constant() in os.environ


class ModelOutputVar(Var):
    """A Hugging Face ``ModelOutput`` (an ordered dict of its non-None fields that also allows
    attribute and integer access). Built in the trace, or (with a source) one that exists
    outside it, which the trace reads but does not change."""

    def __init__(self, cls: type, fields: dict[str, Var], source=None):
        self.cls = cls
        self.fields = fields  # every dataclass field, None ones included, in declaration order
        self.source = source

    @classmethod
    def construct(cls_, tx, cls: type, args: list[Var], kwargs: dict[str, Var]) -> ModelOutputVar:
        names = [f.name for f in dataclasses.fields(cls)]
        values: dict[str, Var] = {n: const(None) for n in names}
        for n, a in zip(names, args):
            values[n] = a
        for n, a in kwargs.items():
            if n not in values:
                raise Unsupported(f"{cls.__name__} has no field {n!r}")
            values[n] = a
        return cls_(cls, values)

    def python_type(self):
        return self.cls

    def present(self) -> dict[str, Var]:
        return {k: v for k, v in self.fields.items() if not (isinstance(v, ConstVar) and v.value is None)}

    def getattr(self, tx, name):
        if name in self.fields:
            return self.fields[name]
        if name in ("to_tuple", "keys", "values", "items", "get"):
            from fireclay_capture.variables.containers import ContainerMethodVar

            return ContainerMethodVar(self, name)
        raise ObservedException(AttributeError, f"'{self.cls.__name__}' object has no attribute {name!r}")

    def method(self, tx, name, args, kwargs):
        present = self.present()
        if name in ("to_tuple", "values"):
            return TupleVar(list(present.values()))
        if name == "keys":
            return TupleVar([const(k) for k in present])
        if name == "items":
            return TupleVar([TupleVar([const(k), v]) for k, v in present.items()])
        if name == "get":
            k = args[0].as_python_constant()
            return present.get(k, args[1] if len(args) > 1 else const(None))
        raise Unsupported(f"{self.cls.__name__}.{name}")

    def getitem(self, tx, key):
        k = key.as_python_constant()
        present = self.present()
        if isinstance(k, str):
            if k not in present:
                raise ObservedException(KeyError, k)
            return present[k]
        values = list(present.values())
        if isinstance(k, slice):
            return TupleVar(values[k])
        return values[k]

    def setitem(self, tx, key, value):
        self.set_field(tx, key.as_python_constant(), value)

    def setattr(self, tx, name: str, value: Var) -> None:
        self.set_field(tx, name, value)

    def set_field(self, tx, name: Any, value: Var) -> None:
        """``out.name = value`` or ``out[name] = value``: ModelOutput writes both the attribute and
        the mapping entry (a new entry goes last, where the declaration order may not put it)."""
        if self.source is not None:
            raise Unsupported(f"changing a {self.cls.__name__} that exists outside the captured function")
        if name not in self.fields:
            raise Unsupported(f"setting {name!r}, which is not a field of {self.cls.__name__}")
        is_none = isinstance(value, ConstVar) and value.value is None
        was_present = name in self.present()
        if is_none and was_present:
            # ModelOutput keeps the old mapping entry under a None attribute: not modelled.
            raise Unsupported(f"setting the field {name!r} of a {self.cls.__name__} back to None")
        if not is_none and not was_present:
            names = list(self.fields)
            later = names[names.index(name) + 1:]
            if any(n in self.present() for n in later):
                raise Unsupported(f"setting the field {name!r} of a {self.cls.__name__} after later fields "
                                  "(its key would go last)")
        tx.note_mutation(self)
        self.fields[name] = value

    def unpack(self, tx):
        return [const(k) for k in self.present()]

    def as_dict(self) -> DictVar:
        return DictVar(self.present())

    def __repr__(self):
        return f"ModelOutputVar({self.cls.__name__})"
