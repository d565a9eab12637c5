"""The in-memory program model: Program, Graph, Node, Value and their types.

This module is the specification of the IR. Everything else (serializer, printer, verifier,
passes, interpreter) reads and writes these classes.

Node kinds
----------
A graph has exactly three kinds of entries, always in this order:

* **inputs** — ``Graph.inputs``: Values with an :class:`InputSpec` saying whether each is a user
  input, a parameter, a buffer or a lifted constant (the last three name an entry of
  ``Program.weights``).
* **calls** — ``Graph.nodes``: a :class:`Node` applies an op ``dialect::name`` to arguments and
  defines zero or more output Values. Nodes are kept in topological order.
* **outputs** — ``Graph.outputs``: a list of arguments (usually Values) the graph returns.

Arguments
---------
An argument is one of (the serializer tags each one):

* a :class:`Value` defined earlier in the same graph (or a graph input);
* ``None``, ``bool``, ``int``, ``float``, ``str``, ``Ellipsis``;
* a ``list`` or ``tuple`` of arguments, or a ``slice`` whose parts are arguments;
* :class:`SymExpr` — a symbolic integer expression in fireclay-shapes' string form (``"2*s0"``);
* :class:`DType`, :class:`Device`, :class:`Layout`, :class:`MemoryFormat` — torch enums by name;
* :class:`GraphRef` — a sub-graph of the same program, for higher-order ops (cond, while_loop).

Node meta
---------
``Node.meta`` is a JSON-compatible dict. Documented keys:

* ``source``: ``{"file": str, "line": int, "text": str}`` — the user's code that produced it;
* ``stack``: a list of ``source``-shaped dicts, outermost call first, for inlined calls;
* ``module``: dotted path of the ``nn.Module`` whose forward produced the node (``"layers.0.mlp"``);
* ``note``: free text a pass may leave for people reading the IR.

Stages may add their own keys under a ``"<stage>."`` prefix (``"autograd.saved"``).
"""

from __future__ import annotations

import dataclasses
import keyword
import re
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, ClassVar, Union

FORMAT_VERSION: tuple[int, int] = (1, 0)

DTYPES: tuple[str, ...] = (
    "float64", "float32", "float16", "bfloat16",
    "float8_e4m3fn", "float8_e5m2", "float8_e4m3fnuz", "float8_e5m2fnuz",
    "complex128", "complex64", "complex32",
    "int64", "int32", "int16", "int8", "uint8", "uint16", "uint32", "uint64",
    "bool",
)
LAYOUTS: tuple[str, ...] = ("strided", "sparse_coo", "sparse_csr", "sparse_csc", "sparse_bsr",
                            "sparse_bsc", "jagged", "mkldnn")
MEMORY_FORMATS: tuple[str, ...] = ("contiguous_format", "channels_last", "channels_last_3d",
                                   "preserve_format")
SCALAR_KINDS: tuple[str, ...] = ("int", "float", "bool", "opaque")

# ``dialect::name``, or ``aten::<namespace>::<op>.<overload>`` for a custom operator.
_OP_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*::([A-Za-z_][A-Za-z0-9_]*::)?[A-Za-z_][A-Za-z0-9_.]*$")
_VALUE_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_DEVICE = re.compile(r"^[a-z_][a-z0-9_]*(:[0-9]+)?$")

# A dimension (size, stride, offset) is an int or a symbolic expression string.
Dim = Union[int, str]


class IRError(Exception):
    """The one exception type fireclay-ir raises for malformed programs and documents."""


# --------------------------------------------------------------------------- types


def _check_dim(what: str, d: Any) -> Dim:
    if isinstance(d, bool) or not isinstance(d, (int, str)):
        raise IRError(f"{what} must be an int or a symbolic expression string, got {d!r}")
    if isinstance(d, str) and not d.strip():
        raise IRError(f"{what} is an empty expression")
    return d


@dataclass(frozen=True)
class TensorMeta:
    """What is known of a tensor value without its data.

    ``strides`` of ``None`` means contiguous (row-major) for ``shape``. Dims are ints or
    symbolic expression strings over the program's symbols.
    """

    dtype: str
    shape: tuple[Dim, ...]
    strides: tuple[Dim, ...] | None = None
    storage_offset: Dim = 0
    device: str = "cpu"
    requires_grad: bool = False

    def __post_init__(self) -> None:
        if self.dtype not in DTYPES:
            raise IRError(f"unknown dtype {self.dtype!r}; expected one of {', '.join(DTYPES)}")
        object.__setattr__(self, "shape", tuple(_check_dim("shape entry", d) for d in self.shape))
        if self.strides is not None:
            strides = tuple(_check_dim("stride", d) for d in self.strides)
            if len(strides) != len(self.shape):
                raise IRError(f"strides {strides} do not match the rank of shape {self.shape}")
            object.__setattr__(self, "strides", strides)
        _check_dim("storage offset", self.storage_offset)
        if not isinstance(self.device, str) or not _DEVICE.match(self.device):
            raise IRError(f"malformed device {self.device!r}; expected e.g. 'cpu' or 'cuda:0'")
        if not isinstance(self.requires_grad, bool):
            raise IRError(f"requires_grad must be a bool, got {self.requires_grad!r}")

    @property
    def rank(self) -> int:
        return len(self.shape)

    @property
    def is_static(self) -> bool:
        dims = list(self.shape) + list(self.strides or ()) + [self.storage_offset]
        return all(isinstance(d, int) for d in dims)

    def with_(self, **changes: Any) -> TensorMeta:
        """A copy with some fields replaced."""
        return dataclasses.replace(self, **changes)


@dataclass(frozen=True)
class ScalarType:
    """A non-tensor value flowing through the graph: a (symbolic) int, float or bool, or an
    opaque Python object that only the producing and consuming ops understand."""

    kind: str

    def __post_init__(self) -> None:
        if self.kind not in SCALAR_KINDS:
            raise IRError(f"unknown scalar kind {self.kind!r}; expected one of {SCALAR_KINDS}")


ValueType = Union[TensorMeta, ScalarType]


# --------------------------------------------------------------------------- argument atoms


@dataclass(frozen=True)
class SymExpr:
    """A symbolic integer expression, in fireclay-shapes' string form (``"s0*128 + 1"``)."""

    expr: str

    def __post_init__(self) -> None:
        if not isinstance(self.expr, str) or not self.expr.strip():
            raise IRError(f"symbolic expression must be a non-empty string, got {self.expr!r}")


@dataclass(frozen=True)
class _NamedAtom:
    """A name from a closed set (``_allowed``), or a device name when the set is None."""

    name: str
    _kind: ClassVar[str] = ""
    _allowed: ClassVar[tuple[str, ...] | None] = None

    def __post_init__(self) -> None:
        allowed = self._allowed
        if allowed is not None and self.name not in allowed:
            raise IRError(f"unknown {self._kind} {self.name!r}; expected one of {', '.join(allowed)}")
        if allowed is None and (not isinstance(self.name, str) or not _DEVICE.match(self.name)):
            raise IRError(f"malformed {self._kind} {self.name!r}")


class DType(_NamedAtom):
    """A torch dtype by name (``DType("float32")``)."""

    _kind, _allowed = "dtype", DTYPES


class Device(_NamedAtom):
    """A torch device by name (``Device("cuda:0")``)."""

    _kind, _allowed = "device", None


class Layout(_NamedAtom):
    """A torch layout by name (``Layout("strided")``)."""

    _kind, _allowed = "layout", LAYOUTS


class MemoryFormat(_NamedAtom):
    """A torch memory format by name (``MemoryFormat("channels_last")``)."""

    _kind, _allowed = "memory format", MEMORY_FORMATS


@dataclass(frozen=True)
class GraphRef:
    """A reference to another graph of the same program, by name."""

    name: str


@dataclass(frozen=True)
class InputSpec:
    """What a graph input is: ``user`` input, or a ``parameter``/``buffer``/``constant`` that
    names an entry of ``Program.weights`` as its ``target``."""

    kind: str = "user"
    target: str | None = None

    KINDS = ("user", "parameter", "buffer", "constant")

    def __post_init__(self) -> None:
        if self.kind not in self.KINDS:
            raise IRError(f"unknown input kind {self.kind!r}; expected one of {self.KINDS}")
        if (self.kind == "user") != (self.target is None):
            raise IRError(f"input kind {self.kind!r} {'takes no' if self.kind == 'user' else 'needs a'} target")


# --------------------------------------------------------------------------- values and nodes


class Value:
    """An SSA value: a graph input or one output of a node. ``users`` lists the nodes that read
    it, in first-use order; ``Graph.outputs`` uses are not counted there."""

    __slots__ = ("name", "type", "node", "index", "_users", "__weakref__")

    def __init__(self, name: str, type: ValueType, node: Node | None = None, index: int = 0):
        self.name = name
        self.type = type
        self.node = node
        self.index = index
        self._users: dict[Node, None] = {}

    @property
    def users(self) -> list[Node]:
        return list(self._users)

    @property
    def meta(self) -> TensorMeta:
        """The TensorMeta of a tensor value (raises for scalars)."""
        if not isinstance(self.type, TensorMeta):
            raise IRError(f"value %{self.name} is a {self.type.kind} scalar, not a tensor")
        return self.type

    @property
    def is_tensor(self) -> bool:
        return isinstance(self.type, TensorMeta)

    def __repr__(self) -> str:
        return f"%{self.name}"


def iter_values(arg: Any) -> Iterator[Value]:
    """Every Value referenced by an argument, depth first."""
    if isinstance(arg, Value):
        yield arg
    elif isinstance(arg, (list, tuple)):
        for a in arg:
            yield from iter_values(a)
    elif isinstance(arg, dict):
        for a in arg.values():
            yield from iter_values(a)
    elif isinstance(arg, slice):
        for a in (arg.start, arg.stop, arg.step):
            yield from iter_values(a)


def map_values(arg: Any, fn: Callable[[Value], Any]) -> Any:
    """Rebuild an argument with every Value replaced by ``fn(value)``."""
    if isinstance(arg, Value):
        return fn(arg)
    if isinstance(arg, list):
        return [map_values(a, fn) for a in arg]
    if isinstance(arg, tuple):
        return tuple(map_values(a, fn) for a in arg)
    if isinstance(arg, dict):
        return {k: map_values(v, fn) for k, v in arg.items()}
    if isinstance(arg, slice):
        return slice(map_values(arg.start, fn), map_values(arg.stop, fn), map_values(arg.step, fn))
    return arg


class Node:
    """One call: ``outputs = op(*args, **kwargs)``; ``op`` is ``"dialect::name"``."""

    __slots__ = ("op", "args", "kwargs", "outputs", "meta", "graph", "__weakref__")

    def __init__(self, op: str, args: tuple[Any, ...], kwargs: dict[str, Any], meta: dict[str, Any] | None = None):
        if not isinstance(op, str) or not _OP_NAME.match(op):
            raise IRError(f"malformed op name {op!r}; expected 'dialect::name'")
        self.op = op
        self.args = tuple(args)
        self.kwargs = dict(kwargs)
        self.outputs: list[Value] = []
        self.meta: dict[str, Any] = dict(meta or {})
        self.graph: Graph | None = None

    @property
    def dialect(self) -> str:
        return self.op.split("::", 1)[0]

    @property
    def target(self) -> str:
        """The op's name inside its dialect (``add.Tensor`` for ``aten::add.Tensor``)."""
        return self.op.split("::", 1)[1]

    @property
    def output(self) -> Value:
        """The single output of a one-output node."""
        if len(self.outputs) != 1:
            raise IRError(f"{self.op} has {len(self.outputs)} outputs, not one")
        return self.outputs[0]

    def inputs(self) -> list[Value]:
        """The distinct Values this node reads, in argument order."""
        seen: dict[Value, None] = {}
        for v in iter_values((self.args, self.kwargs)):
            seen[v] = None
        return list(seen)

    @property
    def source(self) -> dict[str, Any] | None:
        return self.meta.get("source")

    def __repr__(self) -> str:
        outs = ", ".join(repr(o) for o in self.outputs)
        return f"<Node {outs} = {self.op}>"


# --------------------------------------------------------------------------- graph


class Graph:
    """Inputs, nodes in topological order, outputs. Use-def links are kept up to date by the
    builder methods; mutate nodes through them, not by assigning ``Node.args`` directly."""

    def __init__(self, name: str = "main"):
        if not _VALUE_NAME.match(name):
            raise IRError(f"malformed graph name {name!r}")
        self.name = name
        self.inputs: list[Value] = []
        self.input_specs: list[InputSpec] = []
        self.nodes: list[Node] = []
        self.outputs: list[Any] = []
        self.meta: dict[str, Any] = {}
        self._names: set[str] = set()
        self._counter = 0
        self._insert_at: int | None = None

    # -- naming
    def _fresh_name(self, hint: str | None) -> str:
        if hint:
            base = re.sub(r"[^A-Za-z0-9_]", "_", hint)
            if not base or base[0].isdigit():
                base = "v_" + base
            if keyword.iskeyword(base):
                base += "_"
            name, k = base, 1
            while name in self._names:
                name, k = f"{base}_{k}", k + 1
        else:
            while f"v{self._counter}" in self._names:
                self._counter += 1
            name = f"v{self._counter}"
        self._names.add(name)
        return name

    # -- building
    def add_input(self, name: str, type: ValueType, spec: InputSpec | None = None) -> Value:
        """Append a graph input."""
        _check_type(type)
        value = Value(self._fresh_name(name), type)
        self.inputs.append(value)
        self.input_specs.append(spec or InputSpec())
        return value

    def call(
        self,
        op: str,
        args: Sequence[Any] = (),
        kwargs: dict[str, Any] | None = None,
        *,
        out: ValueType | Sequence[ValueType] | None = None,
        name: str | None = None,
        meta: dict[str, Any] | None = None,
    ) -> Any:
        """Add a node and return its output Value (``out`` a type), a tuple of Values (``out``
        a list of types) or ``()`` (``out`` None or empty)."""
        node = Node(op, tuple(args), dict(kwargs or {}), meta)
        single = isinstance(out, (TensorMeta, ScalarType))
        types: list[ValueType] = [out] if isinstance(out, (TensorMeta, ScalarType)) else list(out or [])
        for i, t in enumerate(types):
            _check_type(t)
            hint = name if (name and len(types) == 1) else (f"{name}_{i}" if name else None)
            node.outputs.append(Value(self._fresh_name(hint), t, node, i))
        self.insert(node)
        if single:
            return node.outputs[0]
        return tuple(node.outputs)

    def insert(self, node: Node) -> Node:
        """Insert a constructed node at the insertion point (default: the end)."""
        if node.graph is not None:
            raise IRError(f"{node!r} already belongs to graph {node.graph.name!r}")
        for o in node.outputs:
            self._names.add(o.name)
        node.graph = self
        for v in node.inputs():
            v._users[node] = None
        if self._insert_at is None:
            self.nodes.append(node)
        else:
            self.nodes.insert(self._insert_at, node)
            self._insert_at += 1
        return node

    def copy_node(self, node: Node, lookup: Callable[[Value], Any]) -> Node:
        """Insert a copy of ``node`` (usually from another graph) at the insertion point: the same
        op, meta and output types, its arguments' values mapped through ``lookup``, its outputs
        named after the originals (made unique in this graph). The copy's ``outputs[i]`` stands for
        ``node.outputs[i]``."""
        copy = Node(node.op, map_values(node.args, lookup), map_values(node.kwargs, lookup), dict(node.meta))
        for o in node.outputs:
            copy.outputs.append(Value(self._fresh_name(o.name), o.type, copy, o.index))
        return self.insert(copy)

    @contextmanager
    def inserting_before(self, anchor: Node | None) -> Iterator[None]:
        """Within the block, new nodes go before ``anchor`` (``None``: at the end)."""
        saved = self._insert_at
        self._insert_at = None if anchor is None else self.nodes.index(anchor)
        try:
            yield
        finally:
            self._insert_at = saved

    @contextmanager
    def inserting_after(self, anchor: Node) -> Iterator[None]:
        saved = self._insert_at
        self._insert_at = self.nodes.index(anchor) + 1
        try:
            yield
        finally:
            self._insert_at = saved

    def set_outputs(self, outputs: Iterable[Any]) -> None:
        self.outputs = list(outputs)

    # -- rewriting
    def set_args(self, node: Node, args: Sequence[Any] | None = None, kwargs: dict[str, Any] | None = None) -> None:
        """Replace a node's arguments, keeping use-def links right."""
        for v in node.inputs():
            v._users.pop(node, None)
        if args is not None:
            node.args = tuple(args)
        if kwargs is not None:
            node.kwargs = dict(kwargs)
        for v in node.inputs():
            v._users[node] = None

    def replace_all_uses(self, old: Value, new: Any) -> None:
        """Make every reader of ``old`` (nodes and graph outputs) read ``new`` instead."""
        swap = lambda v: new if v is old else v  # noqa: E731
        for node in list(old._users):
            self.set_args(node, map_values(node.args, swap), map_values(node.kwargs, swap))
        self.outputs = map_values(self.outputs, swap)

    def erase(self, node: Node) -> None:
        """Remove a node whose outputs nobody reads."""
        for o in node.outputs:
            if o._users or any(v is o for v in iter_values(self.outputs)):
                raise IRError(f"cannot erase {node!r}: %{o.name} is still used")
        for v in node.inputs():
            v._users.pop(node, None)
        self.nodes.remove(node)
        node.graph = None

    # -- queries
    def values(self) -> Iterator[Value]:
        yield from self.inputs
        for n in self.nodes:
            yield from n.outputs

    def find(self, op: str) -> list[Node]:
        """All nodes whose op is ``op``."""
        return [n for n in self.nodes if n.op == op]

    def input_spec(self, value: Value) -> InputSpec:
        for v, s in zip(self.inputs, self.input_specs):
            if v is value:
                return s
        raise IRError(f"%{value.name} is not an input of graph {self.name!r}")

    def subgraph_refs(self) -> list[str]:
        """Names of the graphs this graph's nodes refer to."""
        names: list[str] = []

        def walk(a: Any) -> None:
            if isinstance(a, GraphRef):
                names.append(a.name)
            elif isinstance(a, (list, tuple)):
                for x in a:
                    walk(x)
            elif isinstance(a, dict):
                for x in a.values():
                    walk(x)

        for n in self.nodes:
            walk(n.args)
            walk(n.kwargs)
        return names

    def __repr__(self) -> str:
        return f"<Graph {self.name}: {len(self.inputs)} inputs, {len(self.nodes)} nodes>"

    def __str__(self) -> str:
        from fireclay_ir.printer import format_graph  # the printer imports this module

        return format_graph(self)


def _check_type(t: Any) -> None:
    if not isinstance(t, (TensorMeta, ScalarType)):
        raise IRError(f"a value's type must be TensorMeta or ScalarType, got {t!r}")


# --------------------------------------------------------------------------- program


@dataclass
class Symbol:
    """A symbolic size: its current (hint) value and its value range; ``None`` bounds are open."""

    name: str
    hint: int | None = None
    min: int | None = None
    max: int | None = None


@dataclass
class Weight:
    """A parameter, buffer or constant held by reference. ``data`` is the tensor (a
    ``torch.Tensor``, or raw little-endian bytes when torch is absent), or None when the program
    was loaded without its weights file."""

    meta: TensorMeta
    data: Any = None


@dataclass
class Program:
    """Named graphs with an entry, and what they share: symbols, guards, weights, metadata."""

    graphs: dict[str, Graph] = field(default_factory=dict)
    entry: str = "main"
    symbols: dict[str, Symbol] = field(default_factory=dict)
    guards: list[str] = field(default_factory=list)
    weights: dict[str, Weight] = field(default_factory=dict)
    metadata: dict[str, Any] = field(default_factory=dict)
    producer: tuple[str, str] = ("fireclay-ir", "0.1.0")
    dialects: dict[str, str] = field(default_factory=dict)
    format_version: tuple[int, int] = FORMAT_VERSION

    @classmethod
    def single(cls, graph: Graph, **kwargs: Any) -> Program:
        """A program whose only graph is ``graph`` (its entry)."""
        return cls(graphs={graph.name: graph}, entry=graph.name, **kwargs)

    @property
    def main(self) -> Graph:
        """The entry graph."""
        try:
            return self.graphs[self.entry]
        except KeyError:
            raise IRError(f"entry graph {self.entry!r} is not among the graphs {sorted(self.graphs)}") from None

    def add_graph(self, graph: Graph) -> Graph:
        if graph.name in self.graphs:
            raise IRError(f"program already has a graph named {graph.name!r}")
        self.graphs[graph.name] = graph
        return graph

    def add_symbol(self, name: str, hint: int | None = None, min: int | None = None, max: int | None = None) -> Symbol:
        sym = Symbol(name, hint, min, max)
        self.symbols[name] = sym
        return sym

    def __str__(self) -> str:
        from fireclay_ir.printer import format_program  # the printer imports this module

        return format_program(self)
