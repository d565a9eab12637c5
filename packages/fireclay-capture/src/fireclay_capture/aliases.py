"""One Var per real mutable object during a trace.

Two sources can reach the same list, dict or user object (the same list passed as two
arguments, a global also passed in, a config shared by two modules). They must become one Var,
or ``a is b`` answers False and a change made through one name is missed through the other.
The trace then relies on the aliasing it saw, in both directions, so both are guarded: a source
that reached an object already seen must still reach that same object, and objects the trace
saw as different must still be different objects.
"""

from __future__ import annotations

from typing import Any

from fireclay_capture.guards import GuardSet
from fireclay_capture.sources import Source


class AliasTable:
    def __init__(self, guards: GuardSet) -> None:
        self._guards = guards
        # id -> (the real object, kept alive so that its id stays unique, and its Var)
        self._by_id: dict[int, tuple[Any, Any]] = {}

    def known(self, value: Any, source: Source):
        """The Var made earlier for ``value`` (guarding that ``source`` still reaches it), or None."""
        entry = self._by_id.get(id(value))
        if entry is None:
            return None
        var = entry[1]
        if var.source != source:
            self._guards.same_object(source, var.source)
        return var

    def remember(self, value: Any, var) -> None:
        self._by_id[id(value)] = (value, var)

    def guard_distinct(self) -> None:
        """Objects seen as different stay different (``a is b`` was answered False). A source
        named once: reads of one source gave different objects where an attribute is computed
        anew on each read (a property behind ``__getattribute__``), and a guard reads it once."""
        sources = list(dict.fromkeys(var.source for _, var in self._by_id.values()))
        if len(sources) > 1:
            self._guards.distinct(sources)
