"""Running torch's Python meta kernels without importing TorchDynamo.

Many of torch's Python references and meta kernels (type promotion wrappers, some
decompositions) are wrapped by ``torch._compile._disable_dynamo``, so that TorchDynamo never
traces into them. That wrapper imports TorchDynamo the first time each function runs, to
build TorchDynamo's ``disable`` wrapper, even when TorchDynamo is not in use: a fresh process's
first fireclay compile of a plain model paid that import (docs/status.md) inside its first meta
kernel.

While TorchDynamo is not imported, no frame can be under its evaluation hook, so its
``disable`` wrapper would only call the function. :func:`install` gives each such function,
found once through torch's reference and decomposition modules, a stand-in that calls it
directly until TorchDynamo is imported (by someone else: fireclay never imports it), and from
then on builds and keeps TorchDynamo's own wrapper, exactly as the original code would have.
Functions not found (modules torch loads later) behave as before: they import TorchDynamo on
first use.
"""

from __future__ import annotations

import functools
import sys
import threading
import types
from collections.abc import Callable, Iterable
from typing import Any

import torch

# the modules whose functions (and everything they wrap or close over) are searched
_MODULE_PREFIXES = ("torch._refs", "torch._prims", "torch._decomp", "torch._meta_registrations")

_lock = threading.Lock()
_installed: list[int] = []  # how many functions got a stand-in, once install has run


def _wrapper_code() -> types.CodeType | None:
    """The code object of the ``inner`` function ``_disable_dynamo`` makes (None: this torch
    builds it differently, and nothing is changed)."""
    factory = getattr(getattr(torch, "_compile", None), "_disable_dynamo", None)
    code = getattr(factory, "__code__", None)
    if code is None:
        return None
    for const in code.co_consts:
        if isinstance(const, types.CodeType) and const.co_name == "inner" and \
                set(const.co_freevars) >= {"fn", "recursive"}:
            return const
    return None


def _roots() -> Iterable[Any]:
    for name, module in list(sys.modules.items()):
        if module is not None and name.startswith(_MODULE_PREFIXES):
            yield from list(vars(module).values())
    tables = getattr(getattr(torch, "_decomp", None), "global_decomposition_table", {})
    for table in list(tables.values()):
        yield from list(table.values())


def _wrappers(code: types.CodeType) -> list[types.FunctionType]:
    """Every ``_disable_dynamo`` wrapper reachable from the roots through ``__wrapped__``,
    ``functools.partial`` and closures."""
    found: list[types.FunctionType] = []
    seen: set[int] = set()
    stack = list(_roots())
    while stack:
        f = stack.pop()
        if id(f) in seen:
            continue
        seen.add(id(f))
        if isinstance(f, functools.partial):
            stack.append(f.func)
            continue
        if not isinstance(f, types.FunctionType):
            continue
        if f.__code__ is code:
            found.append(f)
        wrapped = getattr(f, "__wrapped__", None)
        if wrapped is not None:
            stack.append(wrapped)
        for cell in f.__closure__ or ():
            try:
                stack.append(cell.cell_contents)
            except ValueError:  # an empty cell
                pass
    return found


def _stand_in(fn: Callable[..., Any], recursive: bool) -> Callable[..., Any]:
    """Calls ``fn`` while TorchDynamo is not imported; once it is, replaces itself on ``fn`` by
    TorchDynamo's ``disable`` wrapper (what ``_disable_dynamo`` would have built) and uses that."""

    def call(*args: Any, **kwargs: Any) -> Any:
        dynamo = sys.modules.get("torch._dynamo")  # baseline-ok: looks for TorchDynamo imported elsewhere, never imports it
        disable = getattr(dynamo, "disable", None) if dynamo is not None else None
        if disable is None:
            return fn(*args, **kwargs)
        real = disable(fn, recursive, wrapping=False)
        fn.__dynamo_disable = real  # type: ignore[attr-defined]
        return real(*args, **kwargs)

    return call


def install() -> int:
    """Give every ``_disable_dynamo`` wrapper found a stand-in (once per process; later calls
    return at once). Returns how many got one."""
    if _installed:
        return _installed[0]
    with _lock:
        if _installed:
            return _installed[0]
        count = 0
        code = _wrapper_code()
        if code is not None and "torch._dynamo" not in sys.modules:  # baseline-ok: a check, no import
            for wrapper in _wrappers(code):
                cells = dict(zip(wrapper.__code__.co_freevars, wrapper.__closure__ or ()))
                try:
                    fn, recursive = cells["fn"].cell_contents, cells["recursive"].cell_contents
                except (KeyError, ValueError):
                    continue
                if getattr(fn, "__dynamo_disable", None) is None:
                    fn.__dynamo_disable = _stand_in(fn, recursive)
                    count += 1
        _installed.append(count)
        return count
