"""Upgraders: functions that rewrite a document of format major N into major N + 1.

The reader runs them one after another until the document reaches the current major, then reads
it as usual. Minor versions need no upgrader: a minor bump only adds optional fields whose
defaults the reader supplies (see docs/format/README.md).

Format 1 is the first released major, so the default registry is empty; the first entry will be
``@UPGRADERS.register(1)`` when format 2 ships. An upgrader receives a plain JSON document (dicts
and lists) that nobody has validated: it must not trust it, and whatever it raises is reported as
a FormatError naming both versions.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

from fireclay_ir.serde.limits import FormatError

Document = dict[str, Any]
Upgrader = Callable[[Document], Document]

_VERSION = re.compile(r"^(0|[1-9][0-9]{0,5})\.(0|[1-9][0-9]{0,5})$")


def parse_version(text: Any, where: str = "format_version") -> tuple[int, int]:
    """``"MAJOR.MINOR"`` -> ``(major, minor)``, or a FormatError."""
    if not isinstance(text, str) or not _VERSION.match(text):
        shown = repr(text) if isinstance(text, str) and len(text) < 40 else type(text).__name__
        raise FormatError(where, f"expected a version string 'MAJOR.MINOR' such as '1.0', got {shown}")
    major, minor = text.split(".")
    return int(major), int(minor)


class UpgraderRegistry:
    """Upgraders by the major version they read."""

    def __init__(self) -> None:
        self._steps: dict[int, Upgrader] = {}

    def register(self, from_major: int, fn: Upgrader | None = None) -> Any:
        """Register ``fn`` as the upgrader from ``from_major`` to ``from_major + 1``; usable as a
        decorator (``@registry.register(1)``)."""

        def add(f: Upgrader) -> Upgrader:
            if from_major in self._steps:
                raise ValueError(f"an upgrader from format {from_major}.x is already registered")
            self._steps[from_major] = f
            return f

        return add(fn) if fn is not None else add

    def can_upgrade(self, from_major: int, to_major: int) -> bool:
        return all(m in self._steps for m in range(from_major, to_major))

    def upgrade(self, doc: Document, from_version: tuple[int, int], to_major: int) -> Document:
        """Run the chain of upgraders from ``from_version``'s major to ``to_major``.

        Each step must return a document whose ``format_version`` is ``"<major + 1>.<minor>"``;
        if a step leaves the version untouched it is set to ``"<major + 1>.0"``.
        """
        major = from_version[0]
        if not self.can_upgrade(major, to_major):
            missing = next(m for m in range(major, to_major) if m not in self._steps)
            raise FormatError("format_version", f"the document is format {from_version[0]}.{from_version[1]}, "
                              f"this fireclay-ir reads format {to_major}.x and has no upgrader from "
                              f"{missing}.x to {missing + 1}.0; re-export the program with a newer producer")
        while major < to_major:
            before = doc.get("format_version")
            try:
                doc = self._steps[major](doc)
            except FormatError:
                raise
            except Exception as exc:  # an upgrader reads untrusted data; any failure is a format error
                raise FormatError("", f"upgrading the document from format {major}.x to {major + 1}.0 failed: "
                                      f"{type(exc).__name__}: {exc}") from None
            if not isinstance(doc, dict):
                raise FormatError("", f"the upgrader from format {major}.x returned a "
                                      f"{type(doc).__name__}, not a document")
            if doc.get("format_version") == before:
                doc["format_version"] = f"{major + 1}.0"
            got = parse_version(doc.get("format_version"))
            if got[0] != major + 1:
                raise FormatError("format_version", f"the upgrader from format {major}.x produced format "
                                                    f"{got[0]}.{got[1]}, expected {major + 1}.x")
            major += 1
        return doc


UPGRADERS = UpgraderRegistry()
"""The registry the reader uses unless it is given another one."""
