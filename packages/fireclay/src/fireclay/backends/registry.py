"""The backend registry: names → compilers of captured Programs.

A backend is any callable ``backend(program, example_inputs) -> callable``: it receives the
torch-dialect Program that capture produced and the example inputs, and returns a function that
takes the graph's user inputs and returns its outputs as a sequence.

There is one registry, fireclay-capture's: ``register_backend`` here registers there, so a name is
usable from ``fireclay.compile`` and ``fireclay_capture.capture`` alike. On top of it this module
adds the built-in backends (imported only on first use, so ``import fireclay`` stays light) and
the ``fireclay.backends`` entry-point group of installed distributions.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from importlib.metadata import entry_points
from typing import Any

from fireclay_capture import backends as capture_backends

Backend = Callable[..., Callable[..., Any]]

ENTRY_POINT_GROUP = "fireclay.backends"

# name -> "module:attribute" of the built-ins.
_BUILTINS: dict[str, str] = {
    "eager": "fireclay.backends.builtin:eager",
    "aot_eager": "fireclay.backends.builtin:aot_eager",
    "fireclay": "fireclay.backends.builtin:fireclay",
    "inductor": "fireclay.backends.inductor:inductor",
}


class BackendNotFound(ValueError):
    """No backend of that name is built in, registered, or installed."""


def register_backend(name: str | Backend | None = None, fn: Backend | None = None):
    """Register ``fn`` as ``name``: ``register_backend("x", fn)``, ``@register_backend`` or
    ``@register_backend("x")``."""
    if callable(name) and fn is None:
        capture_backends.register_backend(name.__name__, name)
        return name

    def decorate(f: Backend) -> Backend:
        capture_backends.register_backend(name or f.__name__, f)
        return f

    return decorate(fn) if fn is not None else decorate


def _entry_points() -> dict[str, Any]:
    return {ep.name: ep for ep in entry_points(group=ENTRY_POINT_GROUP)}


def list_backends() -> list[str]:
    """Every name ``lookup_backend`` resolves."""
    return sorted(set(capture_backends.registered_backends()) | set(_BUILTINS) | set(_entry_points()))


def lookup_backend(backend: str | Backend) -> Backend:
    """The backend callable for a name (a callable is returned as it is)."""
    if callable(backend):
        return backend
    if not isinstance(backend, str):
        raise TypeError(f"backend must be a name or a callable, got {type(backend).__name__}")
    if backend in _BUILTINS:
        module, attr = _BUILTINS[backend].split(":")
        return getattr(importlib.import_module(module), attr)
    if backend in capture_backends.registered_backends():
        return capture_backends.lookup_backend(backend)
    found = _entry_points().get(backend)
    if found is not None:
        fn = found.load()
        capture_backends.register_backend(backend, fn)
        return fn
    raise BackendNotFound(
        f"unknown backend {backend!r}; available: {', '.join(list_backends())} (add one with "
        f"fireclay.register_backend or the {ENTRY_POINT_GROUP!r} entry-point group)"
    )
