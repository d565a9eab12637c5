"""Backends: ``(program, example_inputs) -> callable``.

The callable takes the graph's user inputs (``InputSpec("user")``, in graph input order; these
are also ``example_inputs``) and returns its outputs as a sequence. Parameters and buffers are
not passed: they are in ``program.weights``, by reference, so in-place updates are seen; guards
re-capture when a module holds a different tensor object.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from fireclay_ir import Program

Backend = Callable[[Program, list], Callable[..., Any]]
_BACKENDS: dict[str, Backend] = {}


def register_backend(name: str, backend: Backend) -> None:
    """Make ``backend`` available as ``capture(..., backend=name)``."""
    _BACKENDS[name] = backend


def registered_backends() -> list[str]:
    """The names registered so far."""
    return sorted(_BACKENDS)


def lookup_backend(backend: str | Backend) -> Backend:
    if callable(backend):
        return backend
    try:
        return _BACKENDS[backend]
    except KeyError:
        raise ValueError(f"unknown backend {backend!r}; registered: {', '.join(sorted(_BACKENDS))}; "
                         "or pass a callable (program, example_inputs) -> callable") from None


def eager(program: Program, example_inputs: list) -> Callable[..., Any]:
    """Run the captured program op by op with fireclay-ir's reference interpreter."""
    try:
        from fireclay_ir.interpreter import interpret
    except ImportError:  # pragma: no cover - depends on the fireclay-ir version installed
        raise RuntimeError("the 'eager' backend needs fireclay_ir.interpret, which this fireclay-ir "
                           "does not have; upgrade fireclay-ir or pass another backend") from None

    def run(*inputs):
        return interpret(program, *inputs)

    return run


register_backend("eager", eager)
