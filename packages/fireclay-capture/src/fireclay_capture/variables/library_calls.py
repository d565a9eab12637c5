"""Calls into library machinery that capture follows in part: a ``torch.autograd.Function``
applied where no gradient is asked for (its forward is traced like any function), and NumPy
ufuncs on Python numbers (answered at trace time, as constants)."""

from __future__ import annotations

import inspect
import sys
from typing import Any

import torch

from fireclay_capture.errors import Unsupported
from fireclay_capture.variables.base import ConstVar, Var, const, is_constant_value


class _ForwardOnlyContext:
    """The ``ctx`` a Function's forward receives when no backward will run: what it saves or
    marks is never read."""

    def save_for_backward(self, *tensors: Any) -> None:
        pass

    def mark_non_differentiable(self, *tensors: Any) -> None:
        pass

    def mark_dirty(self, *tensors: Any) -> None:
        pass

    def set_materialize_grads(self, value: bool) -> None:
        pass


def _apply_forward_only(cls: Any, *args: Any, **kwargs: Any) -> Any:
    # Traced by the capture (not run). Autograd runs a forward with grad mode off; a Function
    # whose forward takes no ctx has a setup_context of its own, which only prepares the backward.
    with torch.no_grad():
        if cls.setup_context is torch.autograd.Function.setup_context:
            return cls.forward(_ForwardOnlyContext(), *args, **kwargs)
        return cls.forward(*args, **kwargs)


# A Python classmethod up to torch 2.13, a classmethod of the C base class from 2.14 on: either
# way, the object a subclass that does not override ``apply`` finds on its class.
_APPLY = inspect.getattr_static(torch.autograd.Function, "apply")


def is_function_apply(value: Any) -> bool:
    """``value`` is ``SomeFunction.apply`` for a subclass of ``torch.autograd.Function``."""
    owner = getattr(value, "__self__", None)
    return (isinstance(owner, type) and issubclass(owner, torch.autograd.Function)
            and getattr(value, "__name__", None) == "apply"
            and inspect.getattr_static(owner, "apply", None) is _APPLY)


class AutogradFunctionApplyVar(Var):
    """``Cls.apply``: traced through ``Cls.forward`` when grad mode is off or no tensor argument
    requires grad; otherwise the call runs eagerly (its backward is the user's own)."""

    def __init__(self, cls: type, cls_var: Var, source: Any = None):
        self.cls, self.cls_var, self.source = cls, cls_var, source

    def call(self, tx, args, kwargs):
        from fireclay_capture.variables.functions import UserFunctionVar
        from fireclay_capture.variables.tensor import TensorVar

        tensors = [a for a in [*args, *kwargs.values()] if isinstance(a, TensorVar)]
        if torch.is_grad_enabled() and any(t.fake.requires_grad for t in tensors):
            raise Unsupported(f"{self.cls.__qualname__}.apply (a torch.autograd.Function) on tensors that "
                              "require grad: its backward is its own, so the call runs eagerly")
        return tx.inline_call(UserFunctionVar(_apply_forward_only, None), [self.cls_var, *args], kwargs)

    def __repr__(self):
        return f"{self.cls.__qualname__}.apply"


def is_numpy_ufunc(value: Any) -> bool:
    numpy = sys.modules.get("numpy")
    return numpy is not None and isinstance(value, numpy.ufunc)


class NumpyUfuncVar(Var):
    """A NumPy ufunc (``np.sqrt``): on Python numbers it runs at trace time and its result is a
    constant of the trace (a NumPy scalar becomes the Python number it holds, which tensors treat
    alike); on anything else the call runs eagerly."""

    def __init__(self, fn: Any, source: Any = None):
        self.fn, self.source = fn, source

    def call(self, tx, args, kwargs):
        values = [a.as_python_constant() if isinstance(a, ConstVar) else None for a in args]
        if kwargs or not args or any(v is None or not is_constant_value(v) or isinstance(v, (str, bytes))
                                     for v in values):
            raise Unsupported(f"numpy.{self.fn.__name__} on values other than Python numbers")
        result = self.fn(*values)
        return const(result.item() if hasattr(result, "item") and getattr(result, "ndim", 1) == 0 else result)

    def __repr__(self):
        return f"numpy.{self.fn.__name__}"
