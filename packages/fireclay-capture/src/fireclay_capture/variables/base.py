"""The abstract value protocol, constants, and cells.

Every value on the interpreter's stack or in a frame's locals is a :class:`Var`. A Var knows
its ``source`` (where it was read from, for guards and input extraction; ``None`` when it was
made inside the trace) and answers the operations the bytecode applies to it. Operations that a
Var cannot model raise :class:`~fireclay_capture.errors.Unsupported`.
"""

from __future__ import annotations

import enum
import itertools
import operator
import types
from typing import TYPE_CHECKING, Any

import torch

from fireclay_capture.errors import ObservedException, Unsupported
from fireclay_capture.sources import Source

if TYPE_CHECKING:
    from fireclay_capture.trace_state import BreakSpecs, TraceState


class _Null:
    """The NULL that CPython pushes below a callable (PUSH_NULL, LOAD_GLOBAL with the low bit)."""

    def __repr__(self) -> str:
        return "NULL"


NULL = _Null()


# Every Var gets the next number of this count when it is made. A graph break inside an inlined
# call compares the numbers of what the call changed with the count at the break's snapshot:
# only values made after it may have changed (see graph_break._made_by_the_call). Numbers only
# order values, so one count shared by every trace (and thread) is enough.
_VARS_MADE = itertools.count(1)


def vars_made() -> int:
    """A number above that of every Var made so far (and below that of every later one)."""
    return next(_VARS_MADE)


class Var:
    source: Source | None = None
    born: int = 0  # when this value was made: its number from the count above

    def __new__(klass, /, *args: Any, **kwargs: Any):
        self = super().__new__(klass)
        self.born = next(_VARS_MADE)
        return self

    def python_type(self) -> type:
        raise Unsupported(f"type() of {self}")

    def is_constant(self) -> bool:
        return False

    def as_python_constant(self) -> Any:
        raise Unsupported(f"{self} is not a compile-time constant here")

    def getattr(self, tx: TraceState, name: str) -> Var:
        raise ObservedException(AttributeError, f"{self} has no attribute {name!r} the capture can model",
                                certain=False)

    def call(self, tx: TraceState, args: list[Var], kwargs: dict[str, Var]) -> Var:
        raise Unsupported(f"calling {self}")

    def call_method(self, tx: TraceState, name: str, args: list[Var], kwargs: dict[str, Var]) -> Var:
        return self.getattr(tx, name).call(tx, args, kwargs)

    def unpack(self, tx: TraceState) -> list[Var]:
        raise Unsupported(f"iterating over {self}")

    def truth(self, tx: TraceState) -> bool:
        return True

    def getitem(self, tx: TraceState, key: Var) -> Var:
        raise Unsupported(f"indexing {self}")

    def setitem(self, tx: TraceState, key: Var, value: Var) -> None:
        raise Unsupported(f"assigning an item of {self}")

    def identity(self) -> Any:
        """What ``is`` compares: the real object for values that stand for one, else the Var."""
        return self

    def reconstruct(self, specs: BreakSpecs) -> Any:
        """The spec that rebuilds this value in plain Python after a graph break (``specs``
        holds the graph outputs and the shared objects of the break being planned). By default
        a graph output, the value read again from its source, or an object made in the trace;
        raises Unsupported for values that cannot cross a break."""
        return specs.output(self)

    def __repr__(self) -> str:
        return f"{type(self).__name__}()"


# Types whose values are immutable and compared by value: folded at trace time, guarded by ==.
CONSTANT_TYPES = (int, float, bool, str, bytes, complex, type(None), type(Ellipsis),
                  torch.dtype, torch.device, torch.memory_format, torch.layout, range, slice,
                  type(NotImplemented), enum.Enum, types.CodeType,
                  torch.SymInt, torch.SymBool, torch.SymFloat)


def is_constant_value(value: Any) -> bool:
    if isinstance(value, CONSTANT_TYPES):
        return True
    if type(value) in (tuple, torch.Size, frozenset):
        return all(is_constant_value(v) for v in value)
    return False


class ConstVar(Var):
    """An immutable Python value known at trace time (ints, strings, dtypes, ranges, sizes...)."""

    def __init__(self, value: Any, source: Source | None = None):
        self.value = value
        self.source = source

    def python_type(self) -> type:
        return type(self.value)

    def is_constant(self) -> bool:
        return True

    def as_python_constant(self) -> Any:
        return self.value

    def identity(self) -> Any:
        return self.value

    def getattr(self, tx, name):
        try:
            attr = getattr(self.value, name)
        except AttributeError as e:
            raise ObservedException(AttributeError, str(e)) from None
        if callable(attr) and not isinstance(attr, type):
            return ConstMethodVar(self, name, attr)
        return const(attr)

    def unpack(self, tx):
        if isinstance(self.value, (tuple, torch.Size, range, str, bytes, frozenset)):
            return [const(v) for v in self.value]
        if not hasattr(type(self.value), "__iter__") and not hasattr(type(self.value), "__getitem__"):
            # Iterating None or a number fails in the user's code as it would eagerly.
            raise ObservedException(TypeError, f"'{type(self.value).__name__}' object is not iterable")
        raise Unsupported(f"iterating over {type(self.value).__name__} {self.value!r}")

    def truth(self, tx):
        return bool(self.value)

    def getitem(self, tx, key):
        index = key.as_python_constant()
        try:
            item = operator.getitem(self.value, index)
        except (TypeError, IndexError, KeyError, ValueError) as e:
            # The user's code fails here as it would eagerly (subscripting None, an index out
            # of range): an exception the traced code may catch, not a fault of the capture.
            raise ObservedException(type(e), str(e), args_known=e.args if is_constant_value(e.args) else None) \
                from None
        return const(item)

    def __repr__(self):
        return f"ConstVar({self.value!r})"


class FakeIdVar(Var):
    """``id()`` of a value made inside the trace (the object it names does not exist yet when
    the graph is made): it compares equal only to the id of the same value, and may key a dict;
    any arithmetic or ordering on it, which would use a number the graph cannot know, is
    unsupported (as TorchDynamo's fake ids)."""

    def __init__(self, named: Var):
        self.named = named

    def python_type(self) -> type:
        return int

    def identity(self) -> Any:
        return self.named

    def __repr__(self):
        return f"id({self.named})"


class ConstMethodVar(Var):
    """A method of an immutable constant (``"a{}".format``, ``dtype.to_complex``): pure, so it
    is called for real on constant arguments."""

    def __init__(self, owner: ConstVar, name: str, fn: Any):
        self.owner, self.name, self.fn = owner, name, fn

    def call(self, tx, args, kwargs):
        a = [x.as_python_constant() for x in args]
        k = {n: x.as_python_constant() for n, x in kwargs.items()}
        return wrap_constant(self.fn(*a, **k))

    def __repr__(self):
        return f"method {self.name} of {self.owner.value!r}"

    def reconstruct(self, specs):
        if self.source is not None:
            return specs.output(self)
        return ("const", getattr(self.owner.value, self.name))


def const(value: Any, source: Source | None = None) -> ConstVar:
    return ConstVar(value, source)


def wrap_constant(value: Any) -> Var:
    """A Var for a value computed at trace time from constants (lists and dicts stay mutable)."""
    from fireclay_capture.variables.containers import DictVar, ListVar, TupleVar

    if is_constant_value(value):
        return ConstVar(value)
    if type(value) is list:
        return ListVar([wrap_constant(v) for v in value])
    if type(value) is tuple:
        return TupleVar([wrap_constant(v) for v in value])
    if type(value) is dict:
        return DictVar({k: wrap_constant(v) for k, v in value.items()})
    if isinstance(value, tuple) and hasattr(type(value), "_fields"):
        return TupleVar([wrap_constant(v) for v in value], cls=type(value))
    raise Unsupported(f"a {type(value).__name__} value computed at trace time")


class CellVar(Var):
    """A closure cell: made by MAKE_CELL inside the trace, or standing for a real cell of an
    inlined function (its contents read lazily, with a source)."""

    def __init__(self, contents: Any = NULL, real_cell: Any = None, source: Source | None = None):
        self._contents = contents
        self.real_cell = real_cell
        self.source = source
        self.written = False

    @property
    def contents(self) -> Any:
        """What the cell holds now (NULL when empty), without reading a real cell."""
        return self._contents

    def get(self, tx: TraceState) -> Var:
        if self._contents is NULL and self.real_cell is not None and not self.written:
            from fireclay_capture.sources import AttrSource
            try:
                value = self.real_cell.cell_contents
            except ValueError:
                raise Unsupported("reading a closure variable before it was assigned") from None
            src = AttrSource(self.source, "cell_contents") if self.source is not None else None
            self._contents = tx.wrap(value, src)
        if self._contents is NULL:
            raise Unsupported("reading a closure variable before it was assigned")
        return self._contents

    def set(self, value: Var, tx: TraceState) -> None:
        if self.real_cell is not None:
            from fireclay_capture.config import config

            if self.source is None or not config.replay_side_effects:
                raise Unsupported("assigning a nonlocal variable of a function defined outside the capture")
            # A real cell: written after the graph, like an attribute (cells are shared).
            tx.write_attr(self.real_cell, self.source, "cell_contents", value)
            self._contents = value
            self.written = True
            return
        tx.note_mutation(self)
        self._contents = value
        self.written = True

    def reconstruct(self, specs):
        return specs.cell(self)
