"""Side effects of a trace: recorded while tracing, replayed on the real objects after the graph.

Code that changes objects which existed before the frame (an attribute of an argument or of a
module, a global, a list or dict reached from an argument, a global or an attribute, a closure
cell) is not run during the trace. The trace *models* the change instead (later reads see the
written value) and records it here; after the compiled graph has run, :class:`Replay` applies
the recorded changes to the real objects, with tensor values taken from the graph's outputs.

Replay happens in two phases so that one change cannot disturb what another one reads: first
every target object and every new value is read or rebuilt (values may be read through the very
containers being changed), then the changes are applied, in the order the objects were first
changed. A container's change is replayed as its final contents (``lst[:] = items``,
``d.clear(); d.update(items)``), which is exact for plain lists and dicts whatever methods made it.

Objects created inside the frame need no replay: they are built from the graph's outputs.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from fireclay_capture.sources import Source, read_source

DELETED = object()  # marks an attribute or global deleted during the trace
MISSING = object()  # an attribute or global that does not exist


class SideEffects:
    """The changes one trace made to objects that exist outside it."""

    def __init__(self) -> None:
        # (id(obj), name) -> (obj, source, name, Var | DELETED); ``obj`` keeps its id unique.
        self.attrs: dict[tuple[int, str], tuple[Any, Source, str, Any]] = {}
        # (id(globals dict), name) -> (globals dict, name, Var | DELETED)
        self.globals: dict[tuple[int, str], tuple[dict, str, Any]] = {}
        # id(container Var) -> the Var of a list/dict that existed before the frame
        self.containers: dict[int, Any] = {}
        self.order: list[tuple] = []  # keys in the order the objects were first changed
        # (container Var, its items before one change): undone when a break forgets a callee
        self.journal: list[tuple[Any, Any]] = []
        self.version = 0  # bumped on every recorded change
        # n -> (callable, args, kwargs): calls made only for their effect outside the program
        # (logging, warnings.warn), with constant arguments, made again after the graph
        self.calls: dict[int, tuple[Any, tuple, dict]] = {}

    # -- recording
    def _touch(self, key: tuple) -> None:
        self.version += 1
        if key not in self.order:
            self.order.append(key)

    def write_attr(self, obj: Any, source: Source, name: str, value: Any) -> None:
        key = ("attr", id(obj), name)
        self.attrs[(id(obj), name)] = (obj, source, name, value)
        self._touch(key)

    def read_attr(self, obj: Any, name: str) -> Any:
        """The Var written to ``obj.name`` during the trace, DELETED, or None if never written."""
        entry = self.attrs.get((id(obj), name))
        return None if entry is None else entry[3]

    def write_global(self, f_globals: dict, name: str, value: Any) -> None:
        self.globals[(id(f_globals), name)] = (f_globals, name, value)
        self._touch(("global", id(f_globals), name))

    def read_global(self, f_globals: dict, name: str) -> Any:
        entry = self.globals.get((id(f_globals), name))
        return None if entry is None else entry[2]

    def record_call(self, fn: Any, args: tuple, kwargs: dict) -> None:
        n = len(self.calls)
        self.calls[n] = (fn, args, kwargs)
        self._touch(("call", n))

    def mutate_container(self, var: Any) -> None:
        """``var`` (a ListVar/DictVar with a source) is about to change: note it, and keep its
        items as they were so that a graph break inside a callee can undo the change."""
        self.containers[id(var)] = var
        self.journal.append((var, dict(var.items) if isinstance(var.items, dict) else list(var.items)))
        self._touch(("container", id(var)))

    # -- graph breaks inside inlined calls forget what the callee did
    def snapshot(self) -> tuple:
        return (dict(self.attrs), dict(self.globals), dict(self.containers), list(self.order), len(self.journal),
                dict(self.calls))

    def restore(self, snap: tuple) -> None:
        attrs, globals_, containers, order, n_journal, calls = snap
        self.calls = dict(calls)
        while len(self.journal) > n_journal:
            var, items = self.journal.pop()
            var.items = items
        self.attrs, self.globals, self.containers, self.order = dict(attrs), dict(globals_), dict(containers), list(order)
        self.version += 1

    def __bool__(self) -> bool:
        return bool(self.order)


def attribute_now(obj: Any, name: str) -> Any:
    d = getattr(obj, "__dict__", None)
    if d is not None and name in d:
        return d[name]
    return MISSING


@dataclass
class Replay:
    """Recorded changes, ready to apply after a graph: ``targets`` are sources of the objects to
    change, ``values`` output specs of the new values, ``ops`` refer to both by index."""

    targets: list[Source] = field(default_factory=list)
    values: list[Any] = field(default_factory=list)
    ops: list[tuple] = field(default_factory=list)

    def prepare(self, realize: Callable[[Any], Any], L: dict) -> tuple[list, list]:
        """Phase one: read every object to change and build every new value (nothing changes)."""
        return [read_source(s, L) for s in self.targets], [realize(s) for s in self.values]

    def apply(self, prepared: tuple[list, list]) -> None:
        """Phase two: make the changes, in program order."""
        objs, vals = prepared
        for op in self.ops:
            kind = op[0]
            if kind == "attr":
                _, t, name, v = op
                if v is DELETED:
                    delattr(objs[t], name)
                else:
                    setattr(objs[t], name, vals[v])
            elif kind == "global":
                _, g, name, v = op
                if v is DELETED:
                    g.pop(name, None)
                else:
                    g[name] = vals[v]
            elif kind == "call":
                _, fn, args, kwargs = op
                fn(*args, **kwargs)
            elif kind == "list":
                objs[op[1]][:] = vals[op[2]]
            else:
                d = objs[op[1]]
                d.clear()
                d.update(vals[op[2]])


__all__ = ["DELETED", "MISSING", "Replay", "SideEffects", "attribute_now"]
