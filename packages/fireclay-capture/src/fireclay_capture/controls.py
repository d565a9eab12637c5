"""Controls users put in their own code: force a graph break, keep a function eager, ask whether
a capture is running."""

from __future__ import annotations

import functools
import re
from collections.abc import Callable
from typing import Any, TypeVar

F = TypeVar("F", bound=Callable[..., Any])

#: Functions carrying this attribute are never inlined: the capture breaks the graph at their
#: call and runs them in plain Python (without capturing them on their own).
EAGER_MARK = "_fireclay_eager"


def graph_break() -> None:
    """End the current graph here; the rest of the function is captured as another graph."""


setattr(graph_break, EAGER_MARK, True)


def disable(fn: F) -> F:
    """``fn`` always runs eagerly: captured code that calls it breaks its graph around the call."""

    @functools.wraps(fn)
    def run_eagerly(*args, **kwargs):
        return fn(*args, **kwargs)

    setattr(run_eagerly, EAGER_MARK, True)
    return run_eagerly  # type: ignore[return-value]


#: Functions carrying this attribute are recorded as one opaque node ``torch::<value>``.
ALLOWED_MARK = "_fireclay_allowed_op"


def allow_in_graph(fn: F) -> F:
    """Record calls to ``fn`` as one opaque node instead of tracing into it.

    ``fn`` is registered in fireclay-ir's torch dialect as an in-process op
    (``torch::allow_in_graph.<module>.<qualname>``); the output's metadata comes from running
    ``fn`` on fake tensors, so it must work on the meta device. Returns ``fn`` itself.
    """
    from fireclay_ir.dialects.torch import register_callable

    parts = [*(fn.__module__ or "user").split("."), *fn.__qualname__.replace("<", "").replace(">", "").split(".")]
    name = "allow_in_graph." + ".".join(re.sub(r"\W", "_", p) or "_" for p in parts)
    register_callable(name, fn, side_effects=False)
    setattr(fn, ALLOWED_MARK, name)
    return fn


class CaptureWrapper:
    """Base of the callables ``capture()`` returns: captured code that calls one inlines the
    function or module it wraps (``captured_target``) instead of capturing it on its own."""

    @property
    def captured_target(self) -> Any:
        raise NotImplementedError


def is_compiling() -> bool:
    """True while fireclay-capture traces the calling code, False when it runs for real."""
    return False
