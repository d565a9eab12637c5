"""Backends: names for compilers of captured programs, built-in and registered.

A backend is any callable ``backend(program, example_inputs) -> callable``; see
:mod:`fireclay.backends.registry`.
"""

from fireclay.backends.registry import (
    ENTRY_POINT_GROUP,
    BackendNotFound,
    list_backends,
    lookup_backend,
    register_backend,
)

__all__ = ["ENTRY_POINT_GROUP", "BackendNotFound", "list_backends", "lookup_backend", "register_backend"]
