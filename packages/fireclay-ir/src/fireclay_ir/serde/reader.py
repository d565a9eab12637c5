"""JSON document -> Program, checking every field and reporting the first problem by its place.

Nothing here imports by name or evaluates text: op names are checked against the dialect
registries, expressions only against a character set. Every problem is a FormatError whose
``where`` is the place in the document (``graphs.main.nodes[12].args[1]``).
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Callable
from typing import Any, TypeVar

from fireclay_ir.model import (
    FORMAT_VERSION,
    Device,
    DType,
    Graph,
    GraphRef,
    InputSpec,
    IRError,
    Layout,
    MemoryFormat,
    Node,
    Program,
    ScalarType,
    Symbol,
    SymExpr,
    TensorMeta,
    Value,
    Weight,
)
from fireclay_ir.serde.limits import (
    DEFAULT_LIMITS,
    EXPR_CHARS_TEXT,
    INT_MAX,
    INT_MIN,
    FormatError,
    Limits,
    describe,
    is_expression,
    is_identifier,
)
from fireclay_ir.serde.writer import FORMAT_NAME
from fireclay_ir.upgraders import UPGRADERS, UpgraderRegistry, parse_version

_Made = TypeVar("_Made")
# A check of one op name (``check(op, where)``), raising FormatError for an op it rejects.
OpCheck = Callable[[str, str], None]

_INNERMOST = re.compile(r"\[[^\[\]{}]*\]|\{[^\[\]{}]*\}")
_STRING_ONLY = re.compile(r'"(?:[^"\\]|\\.)*"', re.DOTALL)


def _check_nesting(text: str, max_nesting: int) -> None:
    """Refuse text nested deeper than ``max_nesting`` before the JSON parser recurses into it.

    Strings are blanked out, then each pass deletes the innermost bracket pairs; the number of
    passes that still find pairs is the depth. Every step is a C-speed regex over the text.
    """
    bare = _STRING_ONLY.sub('""', text)
    for _ in range(max_nesting):
        bare, found = _INNERMOST.subn("", bare)
        if not found:
            return
    if _INNERMOST.search(bare):  # a pair is left after max_nesting levels were peeled off
        raise FormatError("", f"the document nests deeper than the limit {max_nesting}")


def parse_json(text: str, limits: Limits) -> Any:
    """``json.loads`` with the document bounds, no NaN/Infinity literals and no duplicate keys."""
    if not isinstance(text, str):
        raise FormatError("", f"expected the document as text (str), got {type(text).__name__}")
    if len(text) > limits.max_document_chars:
        raise FormatError("", f"the document has {len(text)} characters, above the limit {limits.max_document_chars}")
    _check_nesting(text, limits.max_nesting)

    def no_constants(name: str) -> Any:
        raise FormatError("", f"the document contains the literal {name}, which JSON does not allow; "
                              "non-finite floats are written as {\"float\": \"inf\"}")

    def unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
        out = dict(pairs)
        if len(out) != len(pairs):
            seen: set[str] = set()
            twice = next(k for k, _ in pairs if k in seen or _add(seen, k))
            raise FormatError("", f"the key {twice!r} appears twice in one object")
        return out

    try:
        return json.loads(text, parse_constant=no_constants, object_pairs_hook=unique_keys)
    except FormatError:
        raise
    except json.JSONDecodeError as exc:
        raise FormatError("", f"not valid JSON: {exc.msg} at line {exc.lineno} column {exc.colno}") from None
    except (RecursionError, ValueError) as exc:  # int() of a huge literal, or a surprise in nesting
        raise FormatError("", f"not readable JSON: {exc}") from None


class _Reader:
    def __init__(self, limits: Limits, lenient: bool):
        self.limits = limits
        self.lenient = lenient  # newer minor version: unknown keys are ignored
        self.nodes = 0
        self.values = 0
        self.graph_names: set[str] = set()
        self.weight_names: set[str] = set()
        # Programs repeat the same few types and expressions thousands of times: check each once.
        self._good_exprs: set[str] = set()
        self._types: dict[str, TensorMeta] = {}

    # -- shapes of JSON data
    def obj(self, x: Any, where: str, required: tuple[str, ...], optional: tuple[str, ...] = ()) -> dict[str, Any]:
        if not isinstance(x, dict):
            raise FormatError(where, f"expected an object with keys {', '.join(required)}, got {describe(x)}")
        for k in required:
            if k not in x:
                raise FormatError(where, f"missing the key {k!r}")
        if not self.lenient:
            extra = [k for k in x if k not in required and k not in optional]
            if extra:
                raise FormatError(where, f"unexpected key {extra[0]!r}; expected only "
                                         f"{', '.join(required + optional)}")
        return x

    def list_(self, x: Any, where: str, what: str) -> list[Any]:
        if not isinstance(x, list):
            raise FormatError(where, f"expected a list of {what}, got {describe(x)}")
        return x

    def str_(self, x: Any, where: str, what: str = "a string", *, name: bool = False) -> str:
        if not isinstance(x, str):
            raise FormatError(where, f"expected {what}, got {describe(x)}")
        bound = self.limits.max_name_chars if name else self.limits.max_string_chars
        if len(x) > bound:
            raise FormatError(where, f"{what} of {len(x)} characters is longer than the limit {bound}")
        return x

    def ident(self, x: Any, where: str, what: str) -> str:
        s = self.str_(x, where, what, name=True)
        if not is_identifier(s):
            raise FormatError(where, f"{what} must be a Python identifier (letters, digits, _), got {s!r}")
        return s

    def int_(self, x: Any, where: str, what: str = "an integer") -> int:
        if isinstance(x, bool) or not isinstance(x, int):
            raise FormatError(where, f"expected {what}, got {describe(x)}")
        if not INT_MIN <= x <= INT_MAX:
            raise FormatError(where, f"integer {describe(x)} does not fit in 64 bits")
        return x

    def opt_int(self, x: Any, where: str) -> int | None:
        return None if x is None else self.int_(x, where, "an integer or null")

    def expr(self, x: Any, where: str, what: str) -> str:
        if x.__class__ is str and x in self._good_exprs:
            return x
        s = self.str_(x, where, what)
        if not is_expression(s):
            raise FormatError(where, f"{what} {s[:60]!r} contains characters an expression may not hold; "
                                     f"allowed are {EXPR_CHARS_TEXT}, and no '__'")
        self._good_exprs.add(s)
        return s

    def dim(self, x: Any, where: str) -> int | str:
        if isinstance(x, str):
            return self.expr(x, where, "a symbolic dimension")
        return self.int_(x, where, "an int or a symbolic expression string")

    def size(self, x: Any, where: str, what: str) -> int | str:
        """A dimension, stride or offset: a symbolic expression or an int that is not negative."""
        d = self.dim(x, where)
        if isinstance(d, int) and d < 0:
            raise FormatError(where, f"{what} must not be negative, got {d}")
        return d

    def plain(self, x: Any, where: str) -> Any:
        """Free JSON data (meta, metadata): strings bounded, numbers finite and 64-bit."""
        if isinstance(x, dict):
            return {self.str_(k, where, "a key", name=True): self.plain(v, f"{where}.{k}") for k, v in x.items()}
        if isinstance(x, list):
            return [self.plain(v, f"{where}[{i}]") for i, v in enumerate(x)]
        if isinstance(x, str):
            return self.str_(x, where)
        if isinstance(x, int) and not isinstance(x, bool):
            return self.int_(x, where)
        if isinstance(x, float) and not math.isfinite(x):
            raise FormatError(where, "non-finite number in meta data")
        return x

    # -- types
    def type_(self, x: Any, where: str) -> TensorMeta | ScalarType:
        if isinstance(x, dict) and len(x) == 1 and "scalar" in x:
            kind = self.str_(x["scalar"], f"{where}.scalar", "a scalar kind", name=True)
            return self.model(f"{where}.scalar", ScalarType, kind)
        t = self.obj(x, where, ("tensor",))
        w = f"{where}.tensor"
        fields = ("dtype", "shape", "strides", "storage_offset", "device", "requires_grad")
        t = self.obj(t["tensor"], w, fields)
        key = json.dumps(t, sort_keys=True)  # exact: true and 1 or 1 and 1.0 stay different keys
        cached = self._types.get(key)
        if cached is not None:
            return cached
        dtype = self.str_(t["dtype"], f"{w}.dtype", "a dtype name", name=True)
        shape = self.list_(t["shape"], f"{w}.shape", "dimensions")
        if len(shape) > self.limits.max_rank:
            raise FormatError(f"{w}.shape", f"rank {len(shape)} is above the limit {self.limits.max_rank}")
        dims = tuple(self.size(d, f"{w}.shape[{i}]", "a dimension") for i, d in enumerate(shape))
        strides = None
        if t["strides"] is not None:
            raw = self.list_(t["strides"], f"{w}.strides", "strides (or null for contiguous)")
            if len(raw) != len(dims):
                raise FormatError(f"{w}.strides", f"{len(raw)} strides for a rank-{len(dims)} shape")
            strides = tuple(self.size(d, f"{w}.strides[{i}]", "a stride") for i, d in enumerate(raw))
        offset = self.size(t["storage_offset"], f"{w}.storage_offset", "a storage offset")
        device = self.str_(t["device"], f"{w}.device", "a device name", name=True)
        grad = t["requires_grad"]
        if not isinstance(grad, bool):
            raise FormatError(f"{w}.requires_grad", f"expected true or false, got {describe(grad)}")
        meta = self.model(w, TensorMeta, dtype, dims, strides, offset, device, grad)
        self._types[key] = meta
        return meta

    @staticmethod
    def model(where: str, make: Callable[..., _Made], *args: Any) -> _Made:
        """``make(*args)`` for a model class, turning its own validation error into a FormatError here."""
        try:
            return make(*args)
        except FormatError:
            raise
        except IRError as exc:
            raise FormatError(where, str(exc)) from None

    # -- arguments
    _ATOM_TAGS = ("value", "none", "ellipsis", "bool", "int", "float", "str", "list", "tuple", "slice",
                  "sym", "dtype", "device", "layout", "memory_format", "graph")

    def arg(self, x: Any, where: str, scope: dict[str, Value]) -> Any:
        if not isinstance(x, dict) or len(x) != 1:
            raise FormatError(where, f"expected a tagged argument (an object with one key such as "
                                     f"{{\"int\": 3}}), got {describe(x)}")
        (tag, v), = x.items()
        w = f"{where}.{tag}"
        if tag == "value":
            name = self.str_(v, w, "a value name", name=True)
            if name not in scope:
                raise FormatError(w, f"refers to %{name}, which is not defined before this point of the graph")
            return scope[name]
        if tag in ("none", "ellipsis"):
            if v is not None:
                raise FormatError(w, f"expected null, got {describe(v)}")
            return None if tag == "none" else Ellipsis
        if tag == "bool":
            if not isinstance(v, bool):
                raise FormatError(w, f"expected true or false, got {describe(v)}")
            return v
        if tag == "int":
            return self.int_(v, w)
        if tag == "float":
            if isinstance(v, str) and v in ("inf", "-inf", "nan"):
                return float(v)
            if isinstance(v, bool) or not isinstance(v, (int, float)):
                raise FormatError(w, f"expected a number or one of 'inf', '-inf', 'nan', got {describe(v)}")
            if isinstance(v, int):
                self.int_(v, w)
            if not math.isfinite(v):  # 1e400 reads as inf: only the spelled-out forms stand for it
                raise FormatError(w, f"the number {describe(v)} is not a finite float; non-finite floats are "
                                     "written as \"inf\", \"-inf\" or \"nan\"")
            return float(v)
        if tag == "str":
            return self.str_(v, w)
        if tag in ("list", "tuple"):
            items = [self.arg(a, f"{w}[{i}]", scope) for i, a in enumerate(self.list_(v, w, "arguments"))]
            return items if tag == "list" else tuple(items)
        if tag == "slice":
            parts = self.list_(v, w, "three arguments (start, stop, step)")
            if len(parts) != 3:
                raise FormatError(w, f"expected three arguments (start, stop, step), got {len(parts)}")
            return slice(*(self.arg(a, f"{w}[{i}]", scope) for i, a in enumerate(parts)))
        if tag == "sym":
            return SymExpr(self.expr(v, w, "a symbolic expression"))
        if tag in ("dtype", "device", "layout", "memory_format"):
            name = self.str_(v, w, f"a {tag} name", name=True)
            atom = {"dtype": DType, "device": Device, "layout": Layout, "memory_format": MemoryFormat}[tag]
            return self.model(w, atom, name)
        if tag == "graph":
            name = self.str_(v, w, "a graph name", name=True)
            if name not in self.graph_names:
                raise FormatError(w, f"refers to graph {name!r}, which the document does not have")
            return GraphRef(name)
        raise FormatError(where, f"unknown argument tag {tag!r}; expected one of {', '.join(self._ATOM_TAGS)}")

    # -- structure
    def count(self, nodes: int, values: int, where: str) -> None:
        self.nodes += nodes
        self.values += values
        if self.nodes > self.limits.max_nodes:
            raise FormatError(where, f"more than {self.limits.max_nodes} nodes in the document")
        if self.values > self.limits.max_values:
            raise FormatError(where, f"more than {self.limits.max_values} values in the document")

    def new_value(self, name: str, where: str, scope: dict[str, Value]) -> str:
        if name in scope:
            raise FormatError(where, f"the value name %{name} is defined twice in this graph")
        return name

    def graph(self, name: str, x: Any, where: str, check_op: OpCheck) -> Graph:
        d = self.obj(x, where, ("inputs", "nodes", "outputs", "meta"))
        g = self.model(where, Graph, name)
        scope: dict[str, Value] = {}
        for i, item in enumerate(self.list_(d["inputs"], f"{where}.inputs", "inputs")):
            w = f"{where}.inputs[{i}]"
            item = self.obj(item, w, ("name", "type", "spec"))
            vname = self.new_value(self.ident(item["name"], f"{w}.name", "a value name"), f"{w}.name", scope)
            vtype = self.type_(item["type"], f"{w}.type")
            spec_doc = self.obj(item["spec"], f"{w}.spec", ("kind",), ("target",))
            kind = self.str_(spec_doc["kind"], f"{w}.spec.kind", "an input kind", name=True)
            target = spec_doc.get("target")
            if target is not None:
                target = self.str_(target, f"{w}.spec.target", "a weight name", name=True)
                if target not in self.weight_names:
                    raise FormatError(f"{w}.spec.target", f"names the weight {target!r}, which is not among the "
                                                          "document's weights")
            spec = self.model(f"{w}.spec", InputSpec, kind, target)
            self.count(0, 1, w)
            value = g.add_input(vname, vtype, spec)
            if value.name != vname:  # the builder renames clashes; a document must not have any
                raise FormatError(f"{w}.name", f"the value name %{vname} clashes with another name of the graph")
            scope[vname] = value
        for i, item in enumerate(self.list_(d["nodes"], f"{where}.nodes", "nodes")):
            w = f"{where}.nodes[{i}]"
            item = self.obj(item, w, ("op", "args", "kwargs", "outputs", "meta"))
            op = self.str_(item["op"], f"{w}.op", "an op name 'dialect::name'", name=True)
            args = [self.arg(a, f"{w}.args[{j}]", scope) for j, a in
                    enumerate(self.list_(item["args"], f"{w}.args", "arguments"))]
            kw_doc = item["kwargs"]
            if not isinstance(kw_doc, dict):
                raise FormatError(f"{w}.kwargs", f"expected an object of keyword arguments, got {describe(kw_doc)}")
            kwargs = {self.ident(k, f"{w}.kwargs", "a keyword name"): self.arg(a, f"{w}.kwargs.{k}", scope)
                      for k, a in kw_doc.items()}
            meta = self.node_meta(item["meta"], f"{w}.meta")
            node = self.model(f"{w}.op", Node, op, tuple(args), kwargs, meta)
            check_op(op, f"{w}.op")
            outs = self.list_(item["outputs"], f"{w}.outputs", "outputs")
            self.count(1, len(outs), w)
            own: set[str] = set()
            for j, o in enumerate(outs):
                ow = f"{w}.outputs[{j}]"
                o = self.obj(o, ow, ("name", "type"))
                oname = self.new_value(self.ident(o["name"], f"{ow}.name", "a value name"), f"{ow}.name", scope)
                if oname in own:
                    raise FormatError(f"{ow}.name", f"the value name %{oname} is defined twice in this graph")
                own.add(oname)
                node.outputs.append(Value(oname, self.type_(o["type"], f"{ow}.type"), node, j))
            g.insert(node)
            for v in node.outputs:
                scope[v.name] = v
        g.set_outputs(self.arg(a, f"{where}.outputs[{i}]", scope) for i, a in
                      enumerate(self.list_(d["outputs"], f"{where}.outputs", "graph outputs")))
        g.meta = self.plain(self.obj_any(d["meta"], f"{where}.meta"), f"{where}.meta")
        return g

    def obj_any(self, x: Any, where: str) -> dict[str, Any]:
        if not isinstance(x, dict):
            raise FormatError(where, f"expected an object, got {describe(x)}")
        return x

    def node_meta(self, x: Any, where: str) -> dict[str, Any]:
        meta: dict[str, Any] = self.plain(self.obj_any(x, where), where)
        if "source" in meta:
            self.source(meta["source"], f"{where}.source")
        if "stack" in meta:
            for i, s in enumerate(self.list_(meta["stack"], f"{where}.stack", "source locations")):
                self.source(s, f"{where}.stack[{i}]")
        return meta

    def source(self, x: Any, where: str) -> None:
        # Meta is a side channel: extra keys (a column, an end line) are allowed, the documented
        # ones must have their documented types because printers and error messages read them.
        s = self.obj_any(x, where)
        for key in ("file", "line"):
            if key not in s:
                raise FormatError(where, f"missing the key {key!r}")
        self.str_(s["file"], f"{where}.file", "a file name")
        self.int_(s["line"], f"{where}.line", "a line number")
        if "text" in s:
            self.str_(s["text"], f"{where}.text", "the source text")

    def program(self, doc: dict[str, Any], version: tuple[int, int], check_op: OpCheck) -> Program:
        fields = ("format", "format_version", "producer", "dialects", "entry", "graphs", "symbols", "guards",
                  "weights", "metadata")
        self.obj(doc, "", fields)
        if doc["format"] != FORMAT_NAME:
            raise FormatError("format", f"expected {FORMAT_NAME!r}, got {describe(doc['format'])}")
        producer = self.obj(doc["producer"], "producer", ("name", "version"))
        prod = (self.str_(producer["name"], "producer.name", name=True),
                self.str_(producer["version"], "producer.version", name=True))
        dialects = {self.ident(k, "dialects", "a dialect name"): self.str_(v, f"dialects.{k}", "a version", name=True)
                    for k, v in self.obj_any(doc["dialects"], "dialects").items()}

        symbols: dict[str, Symbol] = {}
        sym_doc = self.obj_any(doc["symbols"], "symbols")
        if len(sym_doc) > self.limits.max_symbols:
            raise FormatError("symbols", f"{len(sym_doc)} symbols, above the limit {self.limits.max_symbols}")
        for name, s in sym_doc.items():
            w = f"symbols.{name}"
            self.ident(name, w, "a symbol name")
            s = self.obj(s, w, ("hint", "min", "max"))
            symbols[name] = Symbol(name, self.opt_int(s["hint"], f"{w}.hint"), self.opt_int(s["min"], f"{w}.min"),
                                   self.opt_int(s["max"], f"{w}.max"))
        guards = self.list_(doc["guards"], "guards", "guard expressions")
        if len(guards) > self.limits.max_guards:
            raise FormatError("guards", f"{len(guards)} guards, above the limit {self.limits.max_guards}")
        guards = [self.expr(gd, f"guards[{i}]", "a guard expression") for i, gd in enumerate(guards)]

        weights: dict[str, Weight] = {}
        w_doc = self.obj_any(doc["weights"], "weights")
        if len(w_doc) > self.limits.max_weights:
            raise FormatError("weights", f"{len(w_doc)} weights, above the limit {self.limits.max_weights}")
        for name, wt in w_doc.items():
            w = f"weights.{name}"
            self.str_(name, w, "a weight name", name=True)
            if not name:
                raise FormatError(w, "a weight name must not be empty")
            wt = self.obj(wt, w, ("type",))
            meta = self.type_(wt["type"], f"{w}.type")
            if not isinstance(meta, TensorMeta):
                raise FormatError(f"{w}.type", "a weight must have a tensor type")
            weights[name] = Weight(meta)
        self.weight_names = set(weights)

        g_doc = self.obj_any(doc["graphs"], "graphs")
        if not g_doc:
            raise FormatError("graphs", "a program needs at least one graph")
        if len(g_doc) > self.limits.max_graphs:
            raise FormatError("graphs", f"{len(g_doc)} graphs, above the limit {self.limits.max_graphs}")
        for name in g_doc:
            self.ident(name, f"graphs.{name}", "a graph name")
        self.graph_names = set(g_doc)
        entry = self.str_(doc["entry"], "entry", "the entry graph's name", name=True)
        if entry not in g_doc:
            raise FormatError("entry", f"names graph {entry!r}, which the document does not have "
                                       f"(it has {', '.join(sorted(g_doc)[:5])})")
        graphs = {name: self.graph(name, g, f"graphs.{name}", check_op) for name, g in g_doc.items()}
        metadata = self.plain(self.obj_any(doc["metadata"], "metadata"), "metadata")
        return Program(graphs=graphs, entry=entry, symbols=symbols, guards=guards, weights=weights,
                       metadata=metadata, producer=prod, dialects=dialects, format_version=version)


def _add(seen: set[str], key: str) -> bool:
    """Add ``key`` to ``seen``; False, so that it reads as "not seen before" in a condition."""
    seen.add(key)
    return False


def _no_op_check(op: str, where: str) -> None:
    return None


def registry_op_check() -> OpCheck:
    """The op check against the dialect registries, or a syntax-only check while fireclay-ir is
    installed without them."""
    try:
        from fireclay_ir import dialects
    except ImportError:
        return _no_op_check
    lookup = getattr(dialects, "lookup_op", None)
    if lookup is None:
        return _no_op_check
    known: dict[str, bool] = {}

    def check(op: str, where: str) -> None:
        if op not in known:
            try:
                lookup(op)
                known[op] = True
            except IRError as exc:
                known[op] = False
                reason = str(exc).removeprefix(f"unknown op {op}: ")
                raise FormatError(where, f"unknown op {op!r}: {reason}") from None
        elif not known[op]:
            raise FormatError(where, f"unknown op {op!r}; register it in its dialect before loading")

    return check


def from_document(
    doc: Any,
    *,
    limits: Limits = DEFAULT_LIMITS,
    upgraders: UpgraderRegistry = UPGRADERS,
    allow_newer_minor: bool = False,
    check_ops: bool = True,
) -> Program:
    """A Program from a parsed JSON document (after upgrading it to the current major)."""
    if not isinstance(doc, dict):
        raise FormatError("", f"expected a fireclay-ir document (a JSON object), got {describe(doc)}")
    if "format_version" not in doc:
        raise FormatError("", "missing the key 'format_version'; is this a fireclay-ir document?")
    version = parse_version(doc["format_version"])
    ours = FORMAT_VERSION
    ours_text = f"{ours[0]}.{ours[1]}"
    theirs_text = f"{version[0]}.{version[1]}"
    if version[0] > ours[0]:
        raise FormatError("format_version", f"the document is format {theirs_text}, but this fireclay-ir reads "
                                            f"format {ours_text} and older; install a newer fireclay-ir")
    if version[0] < ours[0]:
        doc = upgraders.upgrade(doc, version, ours[0])
        version = parse_version(doc["format_version"])
        theirs_text = f"{version[0]}.{version[1]}"
    lenient = False
    if version[1] > ours[1]:
        if not allow_newer_minor:
            raise FormatError("format_version", f"the document is format {theirs_text}, newer than format "
                                                f"{ours_text} that this fireclay-ir reads; install a newer "
                                                "fireclay-ir, or pass allow_newer_minor=True to read it and "
                                                "ignore the fields this version does not know")
        lenient = True
    check = registry_op_check() if check_ops else _no_op_check
    program = _Reader(limits, lenient).program(doc, (version[0], min(version[1], ours[1])) if lenient else version,
                                               check)
    return program
