"""Dialects are op registries: the only way a name in a document becomes an op.

A :class:`Dialect` maps names (``add.Tensor``, ``torch.nn.functional.gelu``) to :class:`OpDef`
records. Loading a program never imports an arbitrary path: an op that no registry knows is an
error. Stages add dialects (``loops``) or ops (capture's ``allow_in_graph``) through
:meth:`Dialect.register` and :func:`register_dialect`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from fireclay_ir.model import IRError, Node, Program

NO_DEFAULT: Any = object()


@dataclass(frozen=True)
class Argument:
    """One parameter of an op's schema. ``type`` is the schema type text (``Tensor?``,
    ``SymInt[]``, ``Scalar``); ``alias`` the alias annotation (``a!`` marks a write)."""

    name: str
    type: str
    default: Any = NO_DEFAULT
    kwarg_only: bool = False
    alias: str | None = None

    @property
    def has_default(self) -> bool:
        return self.default is not NO_DEFAULT

    @property
    def is_write(self) -> bool:
        return self.alias is not None and "!" in self.alias


@dataclass(frozen=True)
class Return:
    name: str | None
    type: str
    alias: str | None = None


@dataclass(frozen=True)
class OpDef:
    """What a dialect knows of one op.

    ``arguments``/``returns`` are the schema, or ``None`` when the op has no checked schema
    (torch-level callables). ``mutates`` names the arguments the op writes to;
    ``side_effects`` is true for ops that must never be removed or merged (mutation, I/O,
    asserts); ``nondeterministic`` marks random ops (never merged by CSE). ``in_process_only``
    ops were registered at run time from a Python object and cannot be loaded elsewhere.
    """

    dialect: str
    name: str
    arguments: tuple[Argument, ...] | None = None
    returns: tuple[Return, ...] | None = None
    mutates: tuple[str, ...] = ()
    side_effects: bool = False
    nondeterministic: bool = False
    is_view: bool = False
    is_property: bool = False
    in_process_only: bool = False
    tags: tuple[str, ...] = ()
    schema: str | None = None
    doc: str = ""
    resolve: Callable[[], Any] | None = field(default=None, compare=False, repr=False)

    @property
    def qualified_name(self) -> str:
        return f"{self.dialect}::{self.name}"

    @property
    def is_pure(self) -> bool:
        """Safe to remove when unused and to merge with an identical call."""
        return not (self.side_effects or self.mutates or self.nondeterministic)

    def target(self) -> Any:
        """The Python callable implementing the op (may import torch)."""
        if self.resolve is None:
            raise IRError(f"op {self.qualified_name} has no Python implementation")
        return self.resolve()


class Dialect:
    """A named, versioned registry of ops.

    Subclasses may override :meth:`_missing` to resolve names lazily (the torch dialect walks an
    allow-list of modules) and :meth:`verify_node` to add dialect-specific checks.
    """

    def __init__(self, name: str, version: str = "1"):
        self.name = name
        self.version = version
        self._ops: dict[str, OpDef] = {}

    def register(self, op: OpDef, *, replace: bool = False) -> OpDef:
        if op.dialect != self.name:
            raise IRError(f"op {op.qualified_name} registered into dialect {self.name!r}")
        if op.name in self._ops and not replace:
            raise IRError(f"op {op.qualified_name} is already registered")
        self._ops[op.name] = op
        return op

    def lookup(self, name: str) -> OpDef:
        op = self._ops.get(name)
        if op is None:
            op = self._missing(name)
            if op is None:
                raise IRError(f"unknown op {self.name}::{name}: dialect {self.name!r} has no such op"
                              f"{self._hint(name)}")
            self._ops[name] = op
        return op

    def __contains__(self, name: str) -> bool:
        try:
            self.lookup(name)
        except IRError:
            return False
        return True

    def ops(self) -> list[OpDef]:
        """The ops registered so far (lazily resolved dialects list only what was resolved)."""
        return list(self._ops.values())

    def _missing(self, name: str) -> OpDef | None:
        return None

    def _hint(self, name: str) -> str:
        stem = name.split(".")[0]
        close = sorted(n for n in self._ops if n.split(".")[0] == stem)[:5]
        return f" (did you mean {', '.join(close)}?)" if close else ""

    def verify_node(self, node: Node, op: OpDef, program: Program) -> list[str]:
        """Dialect-specific problems with ``node`` (empty when it is fine)."""
        return []

    def __repr__(self) -> str:
        return f"<Dialect {self.name} v{self.version}: {len(self._ops)} ops>"


_DIALECTS: dict[str, Dialect] = {}
# Names that belong to stages not installed here: asking for them explains what to install.
RESERVED = {"loops": "fireclay-loops (import fireclay_loops to register it)"}


def register_dialect(dialect: Dialect, *, replace: bool = False) -> Dialect:
    if dialect.name in _DIALECTS and not replace:
        raise IRError(f"dialect {dialect.name!r} is already registered")
    _DIALECTS[dialect.name] = dialect
    return dialect


def get_dialect(name: str) -> Dialect:
    try:
        return _DIALECTS[name]
    except KeyError:
        pass
    if name in RESERVED:
        raise IRError(f"dialect {name!r} is not registered; it is provided by {RESERVED[name]}")
    raise IRError(f"unknown dialect {name!r}; registered dialects: {', '.join(sorted(_DIALECTS))}")


def dialects() -> dict[str, Dialect]:
    return dict(_DIALECTS)


def lookup_op(qualified: str) -> OpDef:
    """The OpDef of ``"dialect::name"``; IRError for malformed names, unknown dialects or ops."""
    if not isinstance(qualified, str) or "::" not in qualified:
        raise IRError(f"malformed op name {qualified!r}; expected 'dialect::name'")
    dialect, name = qualified.split("::", 1)
    return get_dialect(dialect).lookup(name)
