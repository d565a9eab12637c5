"""Callables: user functions and closures (inlined), bound methods, builtins, context managers."""

from __future__ import annotations

import collections
import contextlib
import inspect
import types
from collections.abc import Callable
from typing import Any

import torch

from fireclay_capture.errors import ObservedException, Unsupported
from fireclay_capture.sources import AttrSource, ConstSource, ItemSource
from fireclay_capture.variables.base import CellVar, Var, const
from fireclay_capture.variables.containers import TupleVar


class UserFunctionVar(Var):
    """A Python function object that exists outside the trace; calls are inlined."""

    def __init__(self, fn: Callable[..., Any], source=None):  # a Python function (or property accessor)
        self.fn = fn
        self.source = source

    def python_type(self):
        return types.FunctionType

    def identity(self):
        return self.fn

    @property
    def code(self):
        return self.fn.__code__

    def frame_inputs(self, tx):
        """(globals, defaults, kwdefaults, closure cells) for inlining."""
        fn = self.fn
        fn_src = self.source if self.source is not None else ConstSource(fn, "f")
        defaults = [tx.wrap(d, ItemSource(AttrSource(fn_src, "__defaults__"), i))
                    for i, d in enumerate(fn.__defaults__ or ())]
        kwdefaults = {k: tx.wrap(v, ItemSource(AttrSource(fn_src, "__kwdefaults__"), k))
                      for k, v in (fn.__kwdefaults__ or {}).items()}
        cells = {}
        for i, (name, cell) in enumerate(zip(fn.__code__.co_freevars, fn.__closure__ or ())):
            # Through the function's own source when it has one: a closure made anew on every
            # call (after a graph break, say) then reuses the cache entry.
            source = ItemSource(AttrSource(self.source, "__closure__"), i) if self.source is not None \
                else ConstSource(cell, "cell")
            cells[name] = tx.cell_var(cell, source)
        return fn.__globals__, defaults, kwdefaults, cells

    def call(self, tx, args, kwargs):
        if is_generator_context_factory(self.fn):
            raise Unsupported(f"a call to {self.fn.__qualname__}, a contextlib.contextmanager (its "
                              "generator runs in steps around the block, between graphs)")
        if self.fn.__code__.co_filename == contextlib.__file__ \
                and self.fn.__qualname__ in ("_GeneratorContextManager.__enter__", "_GeneratorContextManager.__exit__"):
            raise Unsupported(f"entering or leaving a contextlib context manager ({self.fn.__qualname__}), "
                              "which runs between graphs")
        if getattr(self.fn, "_fireclay_eager", False):
            what = "graph_break()" if self.fn.__name__ == "graph_break" else \
                f"{self.fn.__qualname__}, which is marked disable()"
            raise Unsupported(f"a call to {what} (runs eagerly, between graphs)")
        return tx.inline_call(self, args, kwargs)

    def getattr(self, tx, name):
        if name == "__name__":
            return const(self.fn.__name__)
        if name in ("__qualname__", "__module__", "__doc__", "__code__"):
            return const(getattr(self.fn, name))
        if name == "__class__":  # torchvision's usage logging names a function by its type's name
            return tx.wrap(type(self.fn), ConstSource(type(self.fn), "c"))
        if name == "__wrapped__" and hasattr(self.fn, "__wrapped__"):
            return tx.wrap(self.fn.__wrapped__, AttrSource(self.source, name) if self.source else None)
        raise Unsupported(f"reading attribute {name!r} of function {self.fn.__qualname__}")

    def __repr__(self):
        return f"function {self.fn.__qualname__}"

    def reconstruct(self, specs):
        return specs.output(self) if self.source is not None else ("const", self.fn)


def is_generator_context_factory(fn: Any) -> bool:
    """``fn`` is what ``@contextlib.contextmanager`` made of a generator function."""
    code = getattr(fn, "__code__", None)
    return code is not None and code.co_name == "helper" and code.co_filename == contextlib.__file__


class CachedFunctionVar(Var):
    """A ``functools.lru_cache``-wrapped function (transformers' ``is_torch_available`` and the
    like). A cached function is expected to be pure: on constant arguments it is called for real
    at trace time and a constant result folded, as its cache would answer it eagerly from then on;
    otherwise the wrapped function is traced, its cache not consulted (as TorchDynamo does)."""

    def __init__(self, fn: Any, wrapped: Var):
        self.fn, self.wrapped = fn, wrapped

    def python_type(self):
        return type(self.fn)

    def identity(self):
        return self.fn

    def call(self, tx, args, kwargs):
        from fireclay_capture.variables.base import ConstVar, is_constant_value

        if all(isinstance(v, ConstVar) for v in [*args, *kwargs.values()]):
            try:
                result = self.fn(*[a.value for a in args], **{k: v.value for k, v in kwargs.items()})
            except Exception:
                result = None
            else:
                if is_constant_value(result):
                    return const(result)
        return self.wrapped.call(tx, args, kwargs)

    def __repr__(self):
        return f"cached function {getattr(self.fn, '__qualname__', self.fn)}"


class NestedFunctionVar(Var):
    """A function made by MAKE_FUNCTION inside the trace (lambdas, nested defs, comprehensions)."""

    def __init__(self, code: types.CodeType, f_globals: dict, defaults: list[Var],
                 kwdefaults: dict[str, Var], cells: dict[str, CellVar]):
        self.code = code
        self.f_globals = f_globals
        self.defaults = defaults
        self.kwdefaults = kwdefaults
        self.cells = cells

    def python_type(self):
        return types.FunctionType

    def frame_inputs(self, tx):
        return self.f_globals, self.defaults, self.kwdefaults, dict(self.cells)

    def call(self, tx, args, kwargs):
        return tx.inline_call(self, args, kwargs)

    def getattr(self, tx, name):
        if name in ("__name__", "__qualname__"):
            return const(getattr(self.code, "co_" + name.strip("_")))
        if name == "__module__":  # what MAKE_FUNCTION sets: the defining module's name
            return const(self.f_globals.get("__name__"))
        if name == "__class__":
            return tx.wrap(types.FunctionType, ConstSource(types.FunctionType, "c"))
        raise Unsupported(f"reading attribute {name!r} of a nested function")

    def __repr__(self):
        return f"nested function {self.code.co_qualname}"

    def reconstruct(self, specs):
        if self.source is not None:
            return specs.output(self)
        # A function made in the frame (a closure): made again around the same cells.
        missing = [n for n in self.code.co_freevars if n not in self.cells]
        if missing or self.kwdefaults:
            raise Unsupported(f"the inner function {self.code.co_qualname} is live across a graph break")
        return ("function", self.code, self.f_globals, [specs.spec_of(d) for d in self.defaults],
                [specs.cell(self.cells[n]) for n in self.code.co_freevars])


class UserMethodVar(Var):
    """``obj.method`` for a Python method: the function inlined with ``self`` first."""

    def __init__(self, fn: Var, self_var: Var, source=None):
        self.fn, self.self_var, self.source = fn, self_var, source

    def call(self, tx, args, kwargs):
        return self.fn.call(tx, [self.self_var, *args], kwargs)

    def getattr(self, tx, name):
        if name == "__self__":
            return self.self_var
        if name == "__func__":
            return self.fn
        return self.fn.getattr(tx, name)

    def __repr__(self):
        return f"bound {self.fn} of {self.self_var}"

    def reconstruct(self, specs):
        if self.source is not None:
            return specs.output(self)
        return ("method", specs.spec_of(self.fn), specs.spec_of(self.self_var))


class PartialVar(Var):
    """A functools.partial made or found by the trace."""

    def __init__(self, fn: Var, args: list[Var], kwargs: dict[str, Var]):
        self.fn, self.args, self.kwargs = fn, args, kwargs

    def call(self, tx, args, kwargs):
        return self.fn.call(tx, [*self.args, *args], {**self.kwargs, **kwargs})


class BuiltinVar(Var):
    """A Python builtin (len, isinstance, range, ...), an operator/math function or a builtin type
    used as a function; ``fireclay_capture.builtins`` holds the rules."""

    def __init__(self, fn: Any, source=None):
        self.fn = fn
        self.source = source

    def python_type(self):
        return type(self.fn)

    def identity(self):
        return self.fn

    def as_python_constant(self):
        return self.fn

    def call(self, tx, args, kwargs):
        return tx.call_builtin(self.fn, args, kwargs)

    def getitem(self, tx, key):
        # ``list[int]``, ``dict[str, Any]``: annotations of a nested def are evaluated as it runs.
        if isinstance(self.fn, type) and hasattr(self.fn, "__class_getitem__"):
            def real(v):
                if isinstance(v, TupleVar):
                    return tuple(real(i) for i in v.items)
                obj = v.identity()
                return v.as_python_constant() if obj is v else obj

            return const(self.fn[real(key)])
        return super().getitem(tx, key)

    def getattr(self, tx, name):
        if name in ("__name__", "__qualname__", "__module__") and isinstance(getattr(self.fn, name, None), str):
            return const(getattr(self.fn, name))  # a builtin's names are constants
        if isinstance(self.fn, type):
            attr = inspect.getattr_static(self.fn, name, None)
            if isinstance(attr, (classmethod, staticmethod)) or name in ("fromkeys",):
                return BuiltinMethodVar(self.fn, name)
        raise Unsupported(f"attribute {name!r} of builtin {self.fn!r}")

    def __repr__(self):
        return f"builtin {getattr(self.fn, '__name__', self.fn)}"

    def reconstruct(self, specs):
        return specs.output(self) if self.source is not None else ("const", self.fn)


class BuiltinMethodVar(Var):
    def __init__(self, owner: Any, name: str):
        self.owner, self.name = owner, name

    def call(self, tx, args, kwargs):
        from fireclay_capture.variables.base import wrap_constant

        a = [x.as_python_constant() for x in args]
        k = {n: x.as_python_constant() for n, x in kwargs.items()}
        return wrap_constant(getattr(self.owner, self.name)(*a, **k))


# --------------------------------------------------------------------------- context managers

    def reconstruct(self, specs):
        if self.source is not None:
            return specs.output(self)
        return ("const", getattr(self.owner, self.name))


class GradModeVar(Var):
    """``torch.no_grad()``, ``torch.enable_grad()``, ``torch.set_grad_enabled(b)``: entering sets the
    trace's grad mode and records ``torch::torch.set_grad_enabled`` so the graph does the same."""

    def __init__(self, enabled: bool):
        self.enabled = enabled
        self.prior: bool | None = None

    def enter(self, tx) -> Var:
        if self.prior is None:  # set_grad_enabled(b) already switched (and noted the prior mode)
            self.prior = torch.is_grad_enabled()
        tx.set_grad_enabled(self.enabled)
        return const(None)

    def exit(self, tx) -> None:
        tx.set_grad_enabled(self.prior)

    def call(self, tx, args, kwargs):
        # ``@torch.no_grad()`` applied to a function: wrap the call in the mode.
        if len(args) == 1 and not kwargs:
            return GradModeFunctionVar(self.enabled, args[0])
        raise Unsupported("calling a grad-mode object")

    def __repr__(self):
        return f"GradModeVar({self.enabled})"


class AutocastVar(Var):
    """``with torch.autocast(...)``: recorded as enter/exit nodes around the region. Dtypes inside
    come from running the fakes under the real autocast state, which needs fireclay-shapes'
    fake tensors (they dispatch as their real device); a trace on plain meta fakes restarts
    with them."""

    def __init__(self, device_type: str, dtype, enabled: bool, cache_enabled):
        self.device_type, self.dtype, self.enabled, self.cache_enabled = device_type, dtype, enabled, cache_enabled
        self.real: Any = None  # the real torch.autocast while its block is traced
        self.handle = None

    def enter(self, tx) -> Var:
        from fireclay_capture.errors import NeedsFakeTensors
        from fireclay_capture.variables.tensor import to_ir_arg
        from fireclay_capture.variables.torch_names import AUTOCAST_ENTER_OP
        from fireclay_ir import ScalarType

        if tx.shapes is None:
            raise NeedsFakeTensors("torch.autocast needs fake tensors that dispatch as their device")
        self.real = torch.autocast(self.device_type, dtype=self.dtype, enabled=self.enabled,
                                   cache_enabled=self.cache_enabled)
        self.real.__enter__()
        tx.entered_contexts.append(self.real)
        self.handle = tx.graph.call(
            f"torch::{AUTOCAST_ENTER_OP}",
            [self.device_type, to_ir_arg(self.dtype), self.enabled, self.cache_enabled],
            out=ScalarType("opaque"), meta=tx.node_meta())
        return const(None)

    def exit(self, tx) -> None:
        from fireclay_capture.variables.torch_names import AUTOCAST_EXIT_OP

        tx.graph.call(f"torch::{AUTOCAST_EXIT_OP}", [self.handle], out=None, meta=tx.node_meta())
        tx.entered_contexts.remove(self.real)
        self.real.__exit__(None, None, None)


class GradModeFunctionVar(Var):
    def __init__(self, enabled: bool, fn: Var):
        self.enabled, self.fn = enabled, fn

    def call(self, tx, args, kwargs):
        prior = torch.is_grad_enabled()
        tx.set_grad_enabled(self.enabled)
        try:
            return self.fn.call(tx, args, kwargs)
        finally:
            tx.set_grad_enabled(prior)


class ContextExitVar(Var):
    """The ``__exit__`` that BEFORE_WITH leaves on the stack; called with (None, None, None)."""

    def __init__(self, ctx: Var):
        self.ctx = ctx

    def call(self, tx, args, kwargs):
        self.ctx.exit(tx)
        return const(None)

    def reconstruct(self, specs):
        # The block's exit, called where the resumed block ends.
        if self.source is not None:
            return specs.output(self)
        if isinstance(self.ctx, GradModeVar):
            return ("const", RestoreGradMode(self.ctx.prior))
        if isinstance(self.ctx, NullContextVar):
            return ("const", no_exit)
        raise Unsupported(f"a graph break inside a `with` block of {type(self.ctx).__name__}")


class RestoreGradMode:
    """The ``__exit__`` of a grad-mode ``with`` block that a graph break cut in two: the resume
    function calls it where the block ends, and it restores the mode from before the block."""

    def __init__(self, prior: bool):
        self.prior = prior

    def __call__(self, exc_type=None, exc=None, tb=None) -> None:
        torch.set_grad_enabled(self.prior)


def no_exit(exc_type=None, exc=None, tb=None) -> None:
    """The ``__exit__`` of a ``with nullcontext()`` block that a graph break cut in two."""
    return None


class NullContextVar(Var):
    """Context managers with no effect on the graph (``contextlib.nullcontext``)."""

    def __init__(self, value: Var | None = None):
        self.value = value

    def enter(self, tx):
        return self.value if self.value is not None else const(None)

    def exit(self, tx):
        return None


class SuperVar(Var):
    """``super()`` inside a method: attribute lookup starts after ``cls`` in type(self)'s MRO."""

    def __init__(self, cls: type, self_var: Var):
        self.cls, self.self_var = cls, self_var

    def getattr(self, tx, name):
        obj_type = self.self_var.python_type()
        mro = obj_type.__mro__
        start = mro.index(self.cls) + 1 if self.cls in mro else 0
        for klass in mro[start:]:
            if name in klass.__dict__:
                attr = klass.__dict__[name]
                if isinstance(attr, staticmethod):
                    return tx.wrap(attr.__func__, None)
                if isinstance(attr, classmethod):
                    return UserMethodVar(tx.wrap(attr.__func__, None), tx.wrap(obj_type, None))
                if isinstance(attr, types.FunctionType):
                    return UserMethodVar(UserFunctionVar(attr), self.self_var)
                if attr is object.__init__ or attr is torch.nn.Module.__init__:
                    raise Unsupported("calling super().__init__ inside the captured function")
                if klass in (dict, list, tuple, collections.OrderedDict) and hasattr(self.self_var, "builtin_view"):
                    return self.self_var.builtin_view(tx).getattr(tx, name)
                return tx.wrap(attr, None)
        raise ObservedException(AttributeError, f"'super' object has no attribute {name!r}")
