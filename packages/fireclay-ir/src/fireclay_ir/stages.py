"""Which compiler stage an exception came from, and one fallback warning per place in user code.

Every stage marks the work it does with ``in_stage(name)``; an exception leaving that block
carries the innermost stage's name (``stage_of``). Whoever recovers from the failure (runs the
frame eagerly, or a graph in an interpreter) reports it once per place in the user's code with
``warn_fallback``, at WARNING, the level Python's logging shows without any setup.

The names are the pipeline's: ``capture``, ``aten tracing``, ``functionalization``,
``partitioning``, ``lowering``, ``code generation``, ``generated code`` (the compiled graph
failing at its call), ``runtime plan`` (the wrapper that turns a compiled graph's results into
the caller's values), ``backend`` (a backend's own code, outside these).
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator

STAGES = ("capture", "aten tracing", "functionalization", "partitioning", "lowering", "code generation",
          "generated code", "runtime plan", "backend")

_ATTRIBUTE = "fireclay_stage"


@contextlib.contextmanager
def in_stage(name: str) -> Iterator[None]:
    """Tag exceptions leaving the block with ``name``, unless a stage inside already tagged them."""
    try:
        yield
    except Exception as exc:
        tag(exc, name)
        raise


def tag(exc: BaseException, name: str) -> BaseException:
    """Record ``name`` as the stage ``exc`` came from, unless one is recorded already."""
    if getattr(exc, _ATTRIBUTE, None) is None:
        try:
            setattr(exc, _ATTRIBUTE, name)
        except AttributeError:  # an exception type with __slots__: the stage stays unknown
            pass
    return exc


def stage_of(exc: BaseException, default: str = "backend") -> str:
    """The stage ``exc`` was tagged with, or ``default``."""
    return getattr(exc, _ATTRIBUTE, None) or default


def describe(exc: BaseException) -> str:
    """``Type: first line of the message``."""
    text = str(exc).strip()
    first = text.splitlines()[0] if text else ""
    return f"{type(exc).__name__}: {first}" if first else type(exc).__name__


class FallbackNotices:
    """Remembers which (place, stage) pairs have been reported, so each is reported once."""

    def __init__(self) -> None:
        self._seen: set[tuple[str, str]] = set()

    def first(self, place: str, stage: str) -> bool:
        key = (place, stage)
        if key in self._seen:
            return False
        self._seen.add(key)
        return True

    def clear(self) -> None:
        self._seen.clear()


NOTICES = FallbackNotices()


def warn_fallback(logger: logging.Logger, place: str, stage: str, message: str) -> bool:
    """Log ``message`` at WARNING the first time ``stage`` fails at ``place`` (a user's function
    as ``file:line``, or a code object's name); later failures of the same kind log at INFO.
    Returns whether it warned."""
    if NOTICES.first(place, stage):
        logger.warning("%s", message)
        return True
    logger.info("%s", message)
    return False
