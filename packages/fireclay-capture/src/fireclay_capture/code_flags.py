"""The ``co_flags`` bits the capture tests, by name (the same on every supported version)."""

from __future__ import annotations

import inspect
import types

CO_VARARGS = inspect.CO_VARARGS
CO_VARKEYWORDS = inspect.CO_VARKEYWORDS
CO_GENERATOR = inspect.CO_GENERATOR
CO_COROUTINE = inspect.CO_COROUTINE
CO_ITERABLE_COROUTINE = inspect.CO_ITERABLE_COROUTINE
CO_ASYNC_GENERATOR = inspect.CO_ASYNC_GENERATOR

#: Code that suspends (generators, coroutines, async generators): a frame of it cannot be split
#: at a graph break, and a call to it is not wrapped for capture.
SUSPENDING = CO_GENERATOR | CO_COROUTINE | CO_ITERABLE_COROUTINE | CO_ASYNC_GENERATOR
#: Coroutine-like code (async functions and generator-based coroutines), never inlined.
ASYNC = CO_COROUTINE | CO_ITERABLE_COROUTINE | CO_ASYNC_GENERATOR


def suspends(code: types.CodeType) -> bool:
    return bool(code.co_flags & SUSPENDING)


__all__ = ["ASYNC", "CO_ASYNC_GENERATOR", "CO_COROUTINE", "CO_GENERATOR", "CO_ITERABLE_COROUTINE",
           "CO_VARARGS", "CO_VARKEYWORDS", "SUSPENDING", "suspends"]
