"""Sources: where a value the trace relied on lives, relative to the captured frame.

A source turns into a Python expression over ``L`` (the frame's bound arguments) and named
constants (globals dicts, closure cells) that guard and input-extraction code evaluates.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any


class Source:
    def expr(self, consts: dict[int, str]) -> str:
        raise NotImplementedError

    def name_hint(self) -> str:
        raise NotImplementedError

    def parts(self) -> list[Source]:
        """This source and its bases, innermost (the root) first."""
        chain: list[Source] = []
        s: Source | None = self
        while s is not None:
            chain.append(s)
            s = getattr(s, "base", None)
        return chain[::-1]


@dataclass(frozen=True)
class LocalSource(Source):
    name: str

    def expr(self, consts):
        return f"L[{self.name!r}]"

    def name_hint(self):
        return self.name


@dataclass(frozen=True, eq=False)
class ConstSource(Source):
    """A fixed object the guard code refers to by name (a globals dict, a closure cell)."""

    obj: Any = field(compare=False)
    hint: str = "c"

    def __eq__(self, other):
        return isinstance(other, ConstSource) and other.obj is self.obj

    def __hash__(self):
        return hash(("const", id(self.obj)))

    def expr(self, consts):
        return consts[id(self.obj)]

    def name_hint(self):
        return self.hint


class _ChainedSource(Source):
    """A source one step from its ``base``. Chains run deep (``self.encoder.layer[3].attention
    .query.weight``) and sources are hashed often (guard sets, name tables): the hash is
    computed once per object, from the same fields as equality."""

    def __hash__(self):
        h = self.__dict__.get("_hash")
        if h is None:
            h = hash((type(self),) + tuple(getattr(self, f) for f in self.__dataclass_fields__))
            object.__setattr__(self, "_hash", h)
        return h


@dataclass(frozen=True)
class AttrSource(_ChainedSource):
    base: Source
    name: str

    __hash__ = _ChainedSource.__hash__

    def expr(self, consts):
        b = self.base.expr(consts)
        return f"{b}.{self.name}" if self.name.isidentifier() else f"getattr({b}, {self.name!r})"

    def name_hint(self):
        return f"{self.base.name_hint()}_{self.name}"


@dataclass(frozen=True)
class ItemSource(_ChainedSource):
    base: Source
    key: Any

    __hash__ = _ChainedSource.__hash__

    def expr(self, consts):
        return f"{self.base.expr(consts)}[{self.key!r}]"

    def name_hint(self):
        return f"{self.base.name_hint()}_{self.key}"


@dataclass(frozen=True)
class BuiltinItemSource(ItemSource):
    """An item of a dict, list or tuple subclass read with the builtin's own ``__getitem__``
    (the subclass may override it: transformers' ACT2FN builds a module on each lookup)."""

    container: type = dict

    __hash__ = _ChainedSource.__hash__

    def expr(self, consts):
        return f"{self.container.__name__}.__getitem__({self.base.expr(consts)}, {self.key!r})"


def global_source(globals_dict: dict, name: str) -> Source:
    return ItemSource(ConstSource(globals_dict, "G"), name)


def module_member(module_source: Source, table: str, name: str) -> Source:
    """A parameter, buffer or submodule read through the module's own table (fast to re-read:
    a dict lookup instead of ``nn.Module.__getattr__``)."""
    return ItemSource(AttrSource(module_source, table), name)

def read_source(source: Source, L: dict) -> Any:
    """The value ``source`` names, read from a frame's locals ``L``."""
    if isinstance(source, LocalSource):
        return L[source.name]
    if isinstance(source, ConstSource):
        return source.obj
    if isinstance(source, AttrSource):
        return getattr(read_source(source.base, L), source.name)
    if isinstance(source, BuiltinItemSource):
        getitem: Any = source.container.__dict__["__getitem__"]  # the builtin's, not the subclass's
        return getitem(read_source(source.base, L), source.key)
    if isinstance(source, ItemSource):
        return read_source(source.base, L)[source.key]
    raise AssertionError(source)


def clean_name(hint: str) -> str:
    hint = hint.replace("_parameters_", "_").replace("_buffers_", "_").replace("_modules_", "_")
    hint = re.sub(r"[^A-Za-z0-9_]", "_", hint).strip("_")
    hint = re.sub(r"_+", "_", hint)
    if hint.startswith("self_"):
        hint = hint[5:]
    return hint or "arg"
