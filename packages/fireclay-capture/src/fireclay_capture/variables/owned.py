"""Objects that only the trace can reach: ``copy.deepcopy`` / ``copy.copy`` of a plain object
holding no tensors (a transformers config, say). The copy is made for real at trace time; since
nothing outside the trace holds it, its own methods, ``__getattribute__`` and ``__setattr__`` run
on it for real too, with no guards and no replay. What the copy depends on is the original's
state, guarded by equality with a snapshot taken when the trace copied it.

TorchDynamo reaches the same result by tracing ``copy.deepcopy`` itself (``__reduce_ex__`` folded
on the real object); copying for real is the short way to the same graph for tensor-free state.
An owned object may not leave the trace (be returned or stored outside it): that is refused.
"""

from __future__ import annotations

import copy
import inspect
import types
from typing import Any

import torch

from fireclay_capture.errors import ObservedException, Unsupported
from fireclay_capture.variables.base import ConstVar, Var, is_constant_value
from fireclay_capture.variables.containers import DictVar, ListVar, TupleVar


class OwnedObjectVar(Var):
    """A real object made inside the trace (a copy) that nothing outside the trace can see."""

    def __init__(self, obj: Any):
        self.obj = obj

    def python_type(self):
        return type(self.obj)

    def getattr(self, tx, name):
        from fireclay_capture.variables.objects import ClassVar, _class_attribute

        if name == "__class__":
            return ClassVar(type(self.obj))
        if name == "__dict__":
            return DictVar({k: owned_value(tx, v) for k, v in vars(self.obj).items()})
        try:
            value = getattr(self.obj, name)
        except AttributeError as e:
            raise ObservedException(AttributeError, str(e)) from None
        if isinstance(value, types.MethodType) and value.__self__ is self.obj:
            found = _class_attribute(tx, self, type(self.obj), name, None)
            if found is not None:
                return found
        return owned_value(tx, value)

    def setattr(self, tx, name: str, value: Var) -> None:
        tx.note_mutation(self)
        try:
            setattr(self.obj, name, real_value(value))
        except AttributeError as e:
            raise ObservedException(AttributeError, str(e)) from None

    def delattr(self, tx, name: str) -> None:
        tx.note_mutation(self)
        try:
            delattr(self.obj, name)
        except AttributeError as e:
            raise ObservedException(AttributeError, str(e)) from None

    def call(self, tx, args, kwargs):
        return self.getattr(tx, "__call__").call(tx, args, kwargs)

    def _dunder(self, name: str) -> Var | None:
        from fireclay_capture.variables.functions import UserFunctionVar, UserMethodVar

        fn = inspect.getattr_static(type(self.obj), name, None)
        # collections.abc mixins answer through try/except; the class's own methods do.
        if isinstance(fn, types.FunctionType) and fn.__module__ != "collections.abc":
            return UserMethodVar(UserFunctionVar(fn), self)
        return None

    def getitem(self, tx, key):
        method = self._dunder("__getitem__")
        if method is None:
            return super().getitem(tx, key)
        return method.call(tx, [key], {})

    def contains(self, tx, item: Var) -> bool | None:
        method = self._dunder("__contains__")
        return None if method is None else method.call(tx, [item], {}).truth(tx)

    def unpack(self, tx):
        from fireclay_capture.variables.objects import _iterates_as_sequence, _sequence_items

        method = self._dunder("__iter__")
        if method is not None:
            return method.call(tx, [], {}).unpack(tx)
        if _iterates_as_sequence(type(self.obj)):
            return _sequence_items(tx, self)
        return super().unpack(tx)

    def truth(self, tx):
        for name in ("__bool__", "__len__"):
            method = self._dunder(name)
            if method is not None:
                return method.call(tx, [], {}).truth(tx)
        return True

    def __repr__(self):
        return f"OwnedObjectVar({type(self.obj).__name__})"


def owned_value(tx, value: Any) -> Var:
    """A Var for ``value`` read from an owned object: constants and containers by value, objects
    it holds (copies too) as owned objects, anything else as a sourceless value."""
    if is_constant_value(value):
        return ConstVar(value)
    if type(value) is list:
        return ListVar([owned_value(tx, v) for v in value])
    if type(value) is tuple:
        return TupleVar([owned_value(tx, v) for v in value])
    if type(value) is dict and all(isinstance(k, (str, int)) for k in value):
        return DictVar({k: owned_value(tx, v) for k, v in value.items()})
    if _plain_object(value):
        return OwnedObjectVar(value)
    return tx.wrap(value, None)


def _plain_object(value: Any) -> bool:
    return hasattr(value, "__dict__") and not isinstance(
        value, (type, types.FunctionType, types.MethodType, types.ModuleType, torch.nn.Module, torch.Tensor))


def real_value(v: Var) -> Any:
    """The Python value of a Var that an owned object may hold."""
    if v.is_constant():
        return v.as_python_constant()
    if isinstance(v, OwnedObjectVar):
        return v.obj
    if isinstance(v, (ListVar, TupleVar)):
        items = [real_value(i) for i in v.items]
        return items if isinstance(v, ListVar) else tuple(items)
    if isinstance(v, DictVar) and not v.key_vars:
        return {k: real_value(i) for k, i in v.items.items()}
    raise Unsupported(f"storing {v} in an object copied inside the captured function")


def _holds_no_tensors(value: Any, seen: set[int]) -> bool:
    if id(value) in seen or is_constant_value(value):
        return True
    seen.add(id(value))
    if isinstance(value, (torch.Tensor, torch.nn.Module)):
        return False
    if isinstance(value, (list, tuple, set, frozenset)):
        return all(_holds_no_tensors(v, seen) for v in value)
    if isinstance(value, dict):
        return all(_holds_no_tensors(v, seen) for v in value.values())
    if _plain_object(value):
        return all(_holds_no_tensors(v, seen) for v in vars(value).values())
    return True


def copy_of(tx, v: Var, deep: bool) -> Var:
    """``copy.deepcopy(v)`` (``deep``) or ``copy.copy(v)`` inside the trace."""
    from fireclay_capture.variables.objects import ObjectVar

    if v.is_constant():
        return v
    if isinstance(v, (ListVar, TupleVar)):
        items = [copy_of(tx, i, deep) for i in v.items] if deep else list(v.items)
        return ListVar(items) if isinstance(v, ListVar) else TupleVar(items, cls=v.cls)
    if isinstance(v, DictVar) and not v.key_vars:
        return DictVar({k: copy_of(tx, i, deep) if deep else i for k, i in v.items.items()}, cls=v.cls)
    if isinstance(v, OwnedObjectVar):
        return OwnedObjectVar((copy.deepcopy if deep else copy.copy)(v.obj))
    if isinstance(v, ObjectVar) and v.source is not None:
        obj = v.obj
        if any(key[0] == id(obj) for key in tx.side_effects.attrs):
            raise Unsupported(f"copying a {type(obj).__name__} the captured function changed")
        if type(obj).__eq__ is object.__eq__:
            raise Unsupported(f"copying a {type(obj).__name__} (it has no __eq__ to guard its state by)")
        result = (copy.deepcopy if deep else copy.copy)(obj)
        if not _holds_no_tensors(result, set()):
            raise Unsupported(f"copying a {type(obj).__name__} that holds tensors or modules")
        # The copy depends on all of the original's state: guard it equal to a snapshot.
        tx.guards.equals(v.source, copy.deepcopy(obj))
        return OwnedObjectVar(result)
    raise Unsupported(f"copy.{'deepcopy' if deep else 'copy'}() of {v}")
