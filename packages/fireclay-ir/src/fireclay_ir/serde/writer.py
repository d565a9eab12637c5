"""Program -> canonical JSON document.

The same program always gives the same bytes: object keys are sorted, lists keep the program's
order, floats use Python's shortest round-trip form (non-finite ones are tagged strings), and the
text is pure ASCII. The layout puts one node per line so that two documents diff readably.
"""

from __future__ import annotations

import json
import math
from typing import Any

from fireclay_ir.model import (
    FORMAT_VERSION,
    Device,
    DType,
    Graph,
    GraphRef,
    Layout,
    MemoryFormat,
    Program,
    ScalarType,
    SymExpr,
    TensorMeta,
    Value,
)
from fireclay_ir.serde.limits import (
    DEFAULT_LIMITS,
    EXPR_CHARS_TEXT,
    INT_MAX,
    INT_MIN,
    FormatError,
    Limits,
    is_expression,
    is_identifier,
)

FORMAT_NAME = "fireclay-ir"


class _Writer:
    def __init__(self, program: Program, limits: Limits):
        self.program = program
        self.limits = limits
        self._types: dict[TensorMeta, dict[str, Any]] = {}  # the same types recur in every node

    # -- atoms
    def int_(self, x: int, where: str) -> int:
        if not INT_MIN <= x <= INT_MAX:
            raise FormatError(where, f"integer {x} does not fit in 64 bits")
        return x

    def str_(self, x: str, where: str, *, name: bool = False) -> str:
        if not isinstance(x, str):
            raise FormatError(where, f"expected a string, got {type(x).__name__}")
        bound = self.limits.max_name_chars if name else self.limits.max_string_chars
        if len(x) > bound:
            raise FormatError(where, f"string of {len(x)} characters is longer than the limit {bound}")
        return x

    def ident(self, x: Any, where: str, what: str) -> str:
        """Names a reader requires to be identifiers are checked here too, so that whatever is
        written can be read back."""
        if not isinstance(x, str) or not is_identifier(x):
            raise FormatError(where, f"{what} must be a Python identifier (letters, digits, _), got {x!r}")
        return self.str_(x, where, name=True)

    def expr(self, s: str, where: str, what: str) -> str:
        if not is_expression(s):
            raise FormatError(where, f"{what} {s[:60]!r} contains characters an expression may not hold; "
                                     f"allowed are {EXPR_CHARS_TEXT}, and no '__'")
        return self.str_(s, where)

    @staticmethod
    def not_str(x: Any, where: str) -> str:
        raise FormatError(where, f"expected a string, got {type(x).__name__}")

    def dim(self, d: Any, where: str) -> Any:
        return self.int_(d, where) if isinstance(d, int) else self.expr(d, where, "a symbolic dimension")

    def type_(self, t: Any, where: str) -> dict[str, Any]:
        if isinstance(t, ScalarType):
            return {"scalar": t.kind}
        if not isinstance(t, TensorMeta):
            raise FormatError(where, f"a value type must be TensorMeta or ScalarType, got {type(t).__name__}")
        cached = self._types.get(t)
        if cached is not None:
            return cached
        if t.rank > self.limits.max_rank:
            raise FormatError(where, f"rank {t.rank} is above the limit {self.limits.max_rank}")
        doc = self._types[t] = {"tensor": {
            "dtype": t.dtype,
            "shape": [self.dim(d, f"{where}.shape[{i}]") for i, d in enumerate(t.shape)],
            "strides": None if t.strides is None
            else [self.dim(d, f"{where}.strides[{i}]") for i, d in enumerate(t.strides)],
            "storage_offset": self.dim(t.storage_offset, f"{where}.storage_offset"),
            "device": t.device,
            "requires_grad": t.requires_grad,
        }}
        return doc

    def deep(self, depth: int, where: str) -> None:
        if depth > self.limits.max_nesting:
            raise FormatError(where, f"nested deeper than the limit of {self.limits.max_nesting} JSON levels")

    # ``depth`` arguments are the JSON nesting depth the value will have in the document (the
    # document object is depth 1), so that the writer refuses exactly what the reader would.
    def json_(self, x: Any, where: str, depth: int) -> Any:
        """Plain JSON data (meta, metadata): dicts with str keys, lists, atoms; tuples become lists."""
        if x is None or isinstance(x, bool):
            return x
        if isinstance(x, int):
            return self.int_(x, where)
        if isinstance(x, float):
            if not math.isfinite(x):
                raise FormatError(where, f"meta data holds the non-finite float {x}; JSON cannot carry it")
            return x
        if isinstance(x, str):
            return self.str_(x, where)
        if isinstance(x, (list, tuple)):
            self.deep(depth, where)
            return [self.json_(v, f"{where}[{i}]", depth + 1) for i, v in enumerate(x)]
        if isinstance(x, dict):
            self.deep(depth, where)
            out = {}
            for k, v in x.items():
                if not isinstance(k, str):
                    raise FormatError(where, f"meta data keys must be strings, got {k!r}")
                out[self.str_(k, where, name=True)] = self.json_(v, f"{where}.{k}", depth + 1)
            return out
        raise FormatError(where, f"meta data must be plain JSON data, got a {type(x).__name__}")

    # -- arguments
    def arg(self, a: Any, where: str, scope: dict[str, Value], depth: int) -> dict[str, Any]:
        self.deep(depth, where)
        if isinstance(a, Value):
            if scope.get(a.name) is not a:
                raise FormatError(where, f"%{a.name} is not defined in this graph before it is used")
            return {"value": a.name}
        if a is None:
            return {"none": None}
        if a is Ellipsis:
            return {"ellipsis": None}
        if isinstance(a, bool):
            return {"bool": a}
        if isinstance(a, int):
            return {"int": self.int_(a, where)}
        if isinstance(a, float):
            if math.isnan(a):
                return {"float": "nan"}
            if math.isinf(a):
                return {"float": "inf" if a > 0 else "-inf"}
            return {"float": a}
        if isinstance(a, str):
            return {"str": self.str_(a, where)}
        if isinstance(a, (list, tuple)):
            self.deep(depth + 1, where)
            items = [self.arg(x, f"{where}[{i}]", scope, depth + 2) for i, x in enumerate(a)]
            return {"list" if isinstance(a, list) else "tuple": items}
        if isinstance(a, slice):
            parts = (a.start, a.stop, a.step)
            self.deep(depth + 1, where)
            return {"slice": [self.arg(x, f"{where}.slice[{i}]", scope, depth + 2) for i, x in enumerate(parts)]}
        if isinstance(a, SymExpr):
            return {"sym": self.expr(a.expr, where, "a symbolic expression")}
        if isinstance(a, DType):
            return {"dtype": a.name}
        if isinstance(a, Device):
            return {"device": a.name}
        if isinstance(a, Layout):
            return {"layout": a.name}
        if isinstance(a, MemoryFormat):
            return {"memory_format": a.name}
        if isinstance(a, GraphRef):
            if a.name not in self.program.graphs:
                raise FormatError(where, f"refers to graph {a.name!r}, which the program does not have")
            return {"graph": a.name}
        raise FormatError(where, f"cannot serialize an argument of type {type(a).__module__}.{type(a).__name__}; "
                                 "convert it to one of the argument kinds listed in fireclay_ir.model")

    # -- structure
    def graph(self, g: Graph, where: str) -> dict[str, Any]:
        scope: dict[str, Value] = {}
        inputs = []
        for i, (v, spec) in enumerate(zip(g.inputs, g.input_specs)):
            w = f"{where}.inputs[{i}]"
            spec_doc: dict[str, Any] = {"kind": spec.kind}
            if spec.target is not None:
                if spec.target not in self.program.weights:
                    raise FormatError(w, f"input %{v.name} is a {spec.kind} of {spec.target!r}, "
                                         "which is not among the program's weights")
                spec_doc["target"] = spec.target
            inputs.append({"name": self.ident(v.name, w, "a value name"), "type": self.type_(v.type, f"{w}.type"),
                           "spec": spec_doc})
            scope[v.name] = v
        nodes = []
        for i, n in enumerate(g.nodes):
            w = f"{where}.nodes[{i}]"
            args = [self.arg(a, f"{w}.args[{j}]", scope, 7) for j, a in enumerate(n.args)]
            kwargs = {}
            for k, a in n.kwargs.items():
                if not isinstance(k, str):
                    raise FormatError(f"{w}.kwargs", f"keyword names must be strings, got {k!r}")
                kwargs[self.ident(k, f"{w}.kwargs", "a keyword name")] = self.arg(a, f"{w}.kwargs.{k}", scope, 7)
            outputs = []
            for j, o in enumerate(n.outputs):
                if o.name in scope:
                    raise FormatError(f"{w}.outputs[{j}]", f"the name %{o.name} is defined twice in the graph")
                outputs.append({"name": self.ident(o.name, f"{w}.outputs[{j}]", "a value name"),
                                "type": self.type_(o.type, f"{w}.outputs[{j}].type")})
            for o in n.outputs:
                scope[o.name] = o
            nodes.append({"op": self.str_(n.op, f"{w}.op", name=True), "args": args, "kwargs": kwargs,
                          "outputs": outputs, "meta": self.json_(n.meta, f"{w}.meta", 6)})
        outputs = [self.arg(a, f"{where}.outputs[{i}]", scope, 5) for i, a in enumerate(g.outputs)]
        return {"inputs": inputs, "nodes": nodes, "outputs": outputs, "meta": self.json_(g.meta, f"{where}.meta", 4)}

    def document(self) -> dict[str, Any]:
        p = self.program
        if p.entry not in p.graphs:
            raise FormatError("entry", f"entry graph {p.entry!r} is not among the graphs {sorted(p.graphs)}")
        graphs = {}
        for name, g in p.graphs.items():
            self.ident(name, f"graphs.{name}", "a graph name")
            if name != g.name:
                raise FormatError(f"graphs.{name}", f"graph is registered as {name!r} but is named {g.name!r}")
            graphs[name] = self.graph(g, f"graphs.{name}")
        symbols = {}
        for name, s in p.symbols.items():
            w = f"symbols.{name}"
            fields = {"hint": s.hint, "min": s.min, "max": s.max}
            for k, v in fields.items():
                if v is not None and (isinstance(v, bool) or not isinstance(v, int)):
                    raise FormatError(f"{w}.{k}", f"must be an int or None, got {v!r}")
                if v is not None:
                    self.int_(v, f"{w}.{k}")
            symbols[self.ident(name, w, "a symbol name")] = fields
        weights = {}
        for name, wt in p.weights.items():
            if not isinstance(name, str) or not name:
                raise FormatError("weights", f"a weight name must be a non-empty string, got {name!r}")
            weights[self.str_(name, f"weights.{name}", name=True)] = {"type": self.type_(wt.meta, f"weights.{name}.type")}
        if not all(isinstance(x, str) for x in p.producer) or len(p.producer) != 2:
            raise FormatError("producer", f"expected (name, version) strings, got {p.producer!r}")
        return {
            "format": FORMAT_NAME,
            # A writer always writes the newest version it knows, whatever the program was read from.
            "format_version": f"{FORMAT_VERSION[0]}.{FORMAT_VERSION[1]}",
            "producer": {"name": self.str_(p.producer[0], "producer.name", name=True),
                         "version": self.str_(p.producer[1], "producer.version", name=True)},
            "dialects": {self.ident(k, "dialects", "a dialect name"): self.str_(v, f"dialects.{k}", name=True)
                         for k, v in p.dialects.items()},
            "entry": p.entry,
            "graphs": graphs,
            "symbols": symbols,
            "guards": [self.expr(g, f"guards[{i}]", "a guard") if isinstance(g, str) else self.not_str(g, f"guards[{i}]")
                       for i, g in enumerate(p.guards)],
            "weights": weights,
            "metadata": self.json_(p.metadata, "metadata", 2),
        }


def to_document(program: Program, limits: Limits = DEFAULT_LIMITS) -> dict[str, Any]:
    """The JSON document (plain dicts and lists) of a program."""
    if not isinstance(program, Program):
        raise FormatError("", f"expected a fireclay_ir.Program, got {type(program).__name__}")
    return _Writer(program, limits).document()


def _compact(x: Any) -> str:
    return json.dumps(x, sort_keys=True, ensure_ascii=True, allow_nan=False, separators=(", ", ": "))


def _block(items: list[str], indent: str, open_: str, close: str) -> str:
    if not items:
        return open_ + close
    inner = indent + "  "
    return open_ + "\n" + ",\n".join(inner + it for it in items) + "\n" + indent + close


def document_text(doc: dict[str, Any]) -> str:
    """Canonical text of a document: sorted keys, one graph entry (input, node, output) per line."""

    def graph_text(g: dict[str, Any]) -> str:
        parts = []
        for key in sorted(g):
            v = g[key]
            body = _block([_compact(x) for x in v], "      ", "[", "]") if isinstance(v, list) else _compact(v)
            parts.append(f"{_compact(key)}: {body}")
        return _block(parts, "    ", "{", "}")

    parts = []
    for key in sorted(doc):
        v = doc[key]
        if key == "graphs" and isinstance(v, dict):
            body = _block([f"{_compact(k)}: {graph_text(v[k])}" for k in sorted(v)], "  ", "{", "}")
        elif isinstance(v, list):
            body = _block([_compact(x) for x in v], "  ", "[", "]")
        elif isinstance(v, dict) and key in ("symbols", "weights"):
            body = _block([f"{_compact(k)}: {_compact(v[k])}" for k in sorted(v)], "  ", "{", "}")
        else:
            body = _compact(v)
        parts.append(f"{_compact(key)}: {body}")
    return _block(parts, "", "{", "}") + "\n"
