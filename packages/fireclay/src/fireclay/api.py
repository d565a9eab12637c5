"""``fireclay.compile``: torch.compile's contract, over fireclay's stages."""

from __future__ import annotations

import functools
import types
import weakref
from collections.abc import Callable
from typing import Any

import torch

import fireclay
from fireclay.backends import lookup_backend
from fireclay.distributed import ddp_aware, forward_replaced, is_data_parallel, is_fully_sharded
from fireclay.fallback import guarded_backend
from fireclay.modes import resolve_options
from fireclay.verify import verifying
from fireclay_capture import CapturedFunction, capture
from fireclay_ir.stages import NOTICES

fireclay._load_stages()

# Every function fireclay.compile has wrapped and that is still alive, so reset() can reach them.
_live: weakref.WeakSet[CapturedFunction] = weakref.WeakSet()


def reset() -> None:
    """Forget every compiled graph and guard: the next call of any compiled function or module
    captures and compiles again (what a reset of TorchDynamo's caches does for torch.compile),
    and fallbacks are reported again."""
    for captured in list(_live):
        captured.cache.entries.clear()
        captured.cache.given_up = False
    NOTICES.clear()  # fallbacks are reported again


def compile(
    model: Callable[..., Any] | None = None,
    *,
    fullgraph: bool = False,
    dynamic: bool | None = None,
    backend: str | Callable[..., Any] = "fireclay",
    mode: str | None = None,
    options: dict[str, Any] | None = None,
    disable: bool = False,
):
    """Compile a function or ``nn.Module``; usable as ``@fireclay.compile`` or ``@fireclay.compile(...)``.

    ``backend`` is a name from ``fireclay.list_backends()`` or a callable
    ``(program, example_inputs) -> callable``. ``mode`` (``default``, ``reduce-overhead``,
    ``max-autotune``, ``max-autotune-no-cudagraphs``) and ``options`` set backend options
    (``fireclay.list_mode_options(mode)`` shows them). ``fullgraph=True`` makes anything that
    cannot be captured in one graph, and any failure of a later stage, an error naming the file
    and line; otherwise the function is split at such code (which runs in Python between the
    graphs), a frame that cannot be captured at all runs eagerly, and a graph a later stage
    fails on runs in the interpreter, each with one warning (see ``fireclay.fallback``).
    ``disable=True`` returns ``model`` unchanged.
    """
    _check_arguments(fullgraph=fullgraph, dynamic=dynamic, backend=backend, disable=disable)
    resolved = resolve_options(mode, options)
    name = backend if isinstance(backend, str) else getattr(backend, "__name__", repr(backend))
    compiler = verifying(guarded_backend(_with_options(lookup_backend(backend), resolved, fullgraph), name, fullgraph),
                         name)

    def wrap(target: Callable[..., Any]):
        if disable:
            return target
        if not callable(target):
            raise TypeError(f"fireclay.compile takes a function or an nn.Module, got {type(target).__name__}")
        if is_data_parallel(target):
            # DDP's forward (its bucket bookkeeping, buffer broadcast, hooks on the outputs) runs
            # eagerly; only the wrapped module's forward is captured, as TorchDynamo does.
            compiled = capture(target.module.forward, backend=ddp_aware(compiler), fullgraph=fullgraph,
                               dynamic=dynamic)
            _live.add(compiled)
            return DataParallelModule(target, compiled)
        if is_fully_sharded(target):
            # FSDP2's hooks gather the sharded (DTensor) parameters into plain tensors before the
            # forward and free them after: they run eagerly around the captured forward.
            compiled = capture(target.forward, backend=ddp_aware(compiler), fullgraph=fullgraph, dynamic=dynamic)
            _live.add(compiled)
            return HookedModule(target, compiled)
        compiled = capture(target, backend=ddp_aware(compiler), fullgraph=fullgraph, dynamic=dynamic)
        _live.add(compiled)
        if isinstance(target, torch.nn.Module):
            return OptimizedModule(target, compiled)
        if isinstance(target, types.FunctionType):
            functools.update_wrapper(compiled, target, updated=())
        return compiled

    return wrap if model is None else wrap(model)


def _check_arguments(**values: Any) -> None:
    """Arguments of the wrong kind are errors at the call, not surprises later."""
    for name in ("fullgraph", "disable"):
        if not isinstance(values[name], bool):
            raise TypeError(f"fireclay.compile: {name} must be True or False, got {values[name]!r}")
    dynamic = values["dynamic"]
    if dynamic is not None and not isinstance(dynamic, bool):
        raise TypeError(f"fireclay.compile: dynamic must be None (automatic), True or False, got {dynamic!r}")
    backend = values["backend"]
    if not isinstance(backend, str) and not callable(backend):
        raise TypeError(f"fireclay.compile: backend must be a backend name or a callable, got {backend!r}")


def _with_options(backend: Callable[..., Any], options: dict[str, Any], fullgraph: bool = False) -> Callable[..., Any]:
    """Hand options to backends that take them (a keyword ``options``), and ``fullgraph`` to
    those that take it (the ``fireclay`` backend: whether a failing aten graph may fall back)."""
    try:
        import inspect

        parameters = inspect.signature(backend).parameters
    except (TypeError, ValueError):
        parameters = {}
    extra: dict[str, Any] = {}
    if "options" in parameters:
        extra["options"] = options
    if "fullgraph" in parameters:
        extra["fullgraph"] = fullgraph
    return functools.partial(backend, **extra) if extra else backend


class OptimizedModule(torch.nn.Module):
    """A compiled ``nn.Module``: calls go through the compiled forward; parameters, buffers,
    ``state_dict`` and attribute access are the original module's."""

    def __init__(self, original: torch.nn.Module, compiled: CapturedFunction):
        super().__init__()
        # Registered as a child so .to(), .train(), .parameters() reach the original.
        self._orig_mod = original
        object.__setattr__(self, "_compiled", compiled)

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        return self._compiled(*args, **kwargs)

    def __getattr__(self, name: str) -> Any:
        try:
            return super().__getattr__(name)
        except AttributeError:
            return getattr(self._modules["_orig_mod"], name)

    def state_dict(self, *args: Any, **kwargs: Any):
        return self._orig_mod.state_dict(*args, **kwargs)

    def load_state_dict(self, state_dict: Any, *args: Any, **kwargs: Any):
        return self._orig_mod.load_state_dict(state_dict, *args, **kwargs)

    def __repr__(self) -> str:
        return f"OptimizedModule({self._orig_mod!r})"


class DataParallelModule(OptimizedModule):
    """A compiled ``DistributedDataParallel``: DDP's own forward runs eagerly around the wrapped
    module, whose forward is the compiled one for the length of the call (so the module's hooks,
    DDP's reducer and its autograd hooks on the parameters work as in eager)."""

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        ddp = self._orig_mod
        with forward_replaced(ddp.module, self._compiled):
            return ddp(*args, **kwargs)

    def __repr__(self) -> str:
        return f"DataParallelModule({self._orig_mod!r})"


class HookedModule(OptimizedModule):
    """A compiled module whose own hooks must run around its forward (FSDP2's gather and free):
    calling it calls the module, whose forward is the compiled one for the length of the call."""

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        module = self._orig_mod
        with forward_replaced(module, self._compiled):
            return module(*args, **kwargs)
