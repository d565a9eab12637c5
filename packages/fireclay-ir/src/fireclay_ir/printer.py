"""The text form of programs and graphs, for people.

Python-like, one line per node, every value with its type, and the user's source line as a
comment whenever it changes::

    graph main(x: f32[s0, 128], w: f32[128, 64] = param "fc.weight"):
        # model.py:12: y = x @ w
        v0: f32[s0, 64] = aten.mm.default(x, w)
        return (v0,)

Ops print as ``dialect.name``, except the torch dialect, whose names already are Python
qualified names (``torch.nn.functional.gelu``, ``Tensor.view``, ``operator.add``) and print bare.
The text is not parsed back; the JSON format is the interchange form.
"""

from __future__ import annotations

import json
import math
from typing import Any

from fireclay_ir.model import (
    Device,
    DType,
    Graph,
    GraphRef,
    Layout,
    MemoryFormat,
    Node,
    Program,
    ScalarType,
    SymExpr,
    TensorMeta,
    Value,
)

DTYPE_ABBREVIATIONS: dict[str, str] = {
    "float64": "f64", "float32": "f32", "float16": "f16", "bfloat16": "bf16",
    "float8_e4m3fn": "f8e4m3fn", "float8_e5m2": "f8e5m2",
    "float8_e4m3fnuz": "f8e4m3fnuz", "float8_e5m2fnuz": "f8e5m2fnuz",
    "complex128": "c128", "complex64": "c64", "complex32": "c32",
    "int64": "i64", "int32": "i32", "int16": "i16", "int8": "i8",
    "uint8": "u8", "uint16": "u16", "uint32": "u32", "uint64": "u64",
    "bool": "b8",
}
INDENT = "    "
MAX_HEADER_WIDTH = 100


def contiguous_strides(shape: tuple[Any, ...]) -> list[Any]:
    """Row-major strides of ``shape``; symbolic factors multiply as ``a*b`` strings."""
    strides: list[Any] = []
    acc_int, acc_syms = 1, list[str]()
    for d in reversed(shape):
        factors = ([str(acc_int)] if acc_int != 1 else []) + acc_syms
        if not acc_syms:
            strides.append(acc_int)
        elif len(factors) == 1:
            strides.append(factors[0])
        else:  # compound factors need parentheses once multiplied
            strides.append("*".join(f if f.replace("_", "").isalnum() else f"({f})" for f in factors))
        if isinstance(d, int):
            acc_int *= d
        else:
            acc_syms.insert(0, d)
    return strides[::-1]


def _same_dim(a: Any, b: Any) -> bool:
    if isinstance(a, str) and isinstance(b, str):
        return a.replace(" ", "") == b.replace(" ", "")
    return bool(a == b)


def _is_contiguous(meta: TensorMeta) -> bool:
    if meta.strides is None:
        return True
    # A stride along a dimension of size 1 never matters, as in torch's is_contiguous.
    return all(d == 1 or _same_dim(s, c) for d, s, c in zip(meta.shape, meta.strides, contiguous_strides(meta.shape)))


def format_type(t: TensorMeta | ScalarType) -> str:
    """``f32[s0, 128]``; extras in braces only when not the default:
    ``f32[4, 8]{strides=(1, 4), offset=2, cuda:0, requires_grad}``; scalars as ``int``, ``float``..."""
    if isinstance(t, ScalarType):
        return t.kind
    text = f"{DTYPE_ABBREVIATIONS.get(t.dtype, t.dtype)}[{', '.join(str(d) for d in t.shape)}]"
    extras = []
    if not _is_contiguous(t):
        extras.append(f"strides={_tuple_text([str(s) for s in t.strides or ()])}")
    if t.storage_offset != 0:
        extras.append(f"offset={t.storage_offset}")
    if t.device != "cpu":
        extras.append(t.device)
    if t.requires_grad:
        extras.append("requires_grad")
    return text + ("{" + ", ".join(extras) + "}" if extras else "")


def _tuple_text(items: list[str]) -> str:
    return f"({items[0]},)" if len(items) == 1 else f"({', '.join(items)})"


def format_arg(a: Any) -> str:
    """One argument as Python-like text: values by name, symbolic expressions bare, strings quoted."""
    if isinstance(a, Value):
        return a.name
    if a is Ellipsis:
        return "..."
    if isinstance(a, float):
        if math.isnan(a):
            return "nan"
        if math.isinf(a):
            return "inf" if a > 0 else "-inf"
        return repr(a)
    if isinstance(a, (bool, int, str)) or a is None:
        return repr(a)
    if isinstance(a, list):
        return "[" + ", ".join(format_arg(x) for x in a) + "]"
    if isinstance(a, tuple):
        return _tuple_text([format_arg(x) for x in a]) if a else "()"
    if isinstance(a, slice):
        return f"slice({format_arg(a.start)}, {format_arg(a.stop)}, {format_arg(a.step)})"
    if isinstance(a, dict):
        return "{" + ", ".join(f"{k!r}: {format_arg(v)}" for k, v in a.items()) + "}"
    if isinstance(a, SymExpr):
        return a.expr
    if isinstance(a, (DType, Layout, MemoryFormat)):
        return f"torch.{a.name}"
    if isinstance(a, Device):
        return f"device({a.name!r})"
    if isinstance(a, GraphRef):
        return f"@{a.name}"
    return f"<{type(a).__name__}>"


def format_op(op: str) -> str:
    dialect, name = op.split("::", 1)
    return name if dialect == "torch" else f"{dialect}.{name}"


def _source_key(source: Any) -> tuple[Any, Any] | None:
    if not isinstance(source, dict):
        return None
    return source.get("file"), source.get("line")


def _source_comment(source: dict[str, Any]) -> str:
    file = str(source.get("file", "?")).replace("\\", "/").rsplit("/", 1)[-1]
    text = str(source.get("text", "")).strip().replace("\n", " ")
    return f"# {file}:{source.get('line', '?')}" + (f": {text}" if text else "")


def format_node(node: Node) -> str:
    """A node as one line (without indentation or source comment)."""
    args = [format_arg(a) for a in node.args]
    args += [f"{k}={format_arg(node.kwargs[k])}" for k in sorted(node.kwargs)]
    call = f"{format_op(node.op)}({', '.join(args)})"
    if not node.outputs:
        return call
    outs = ", ".join(f"{o.name}: {format_type(o.type)}" for o in node.outputs)
    return f"{outs} = {call}"


def _input_text(value: Value, spec: Any) -> str:
    text = f"{value.name}: {format_type(value.type)}"
    if spec.kind != "user":
        kind = {"parameter": "param"}.get(spec.kind, spec.kind)
        text += f" = {kind} {json.dumps(spec.target)}"
    return text


def graph_lines(graph: Graph) -> list[str]:
    """The lines of one graph, the header unindented and its body indented."""
    inputs = [_input_text(v, s) for v, s in zip(graph.inputs, graph.input_specs)]
    header = f"graph {graph.name}({', '.join(inputs)}):"
    if len(header) <= MAX_HEADER_WIDTH:
        lines = [header]
    else:  # many parameters: one input per line, as a formatter would lay out a long signature
        lines = [f"graph {graph.name}("] + [f"{INDENT}{text}," for text in inputs] + ["):"]
    last = None
    for node in graph.nodes:
        key = _source_key(node.source)
        if key is not None and key != last and node.source is not None:
            lines.append(INDENT + _source_comment(node.source))
        last = key
        lines.append(INDENT + format_node(node))
    outs = [format_arg(a) for a in graph.outputs]
    lines.append(INDENT + "return " + (_tuple_text(outs) if outs else "()"))
    return lines


def format_graph(graph: Graph) -> str:
    """The text form of one graph."""
    return "\n".join(graph_lines(graph)) + "\n"


def _bound(x: int | None, inf: str) -> str:
    return inf if x is None else str(x)


def format_program(program: Program) -> str:
    """The text form of a program: a header (version, producer, dialects, symbols, guards,
    weights), then the entry graph, then the other graphs by name."""
    major, minor = program.format_version
    lines = [f"# fireclay-ir format {major}.{minor}, produced by {program.producer[0]} {program.producer[1]}"]
    if program.dialects:
        lines.append("# dialects: " + ", ".join(f"{k} {program.dialects[k]}" for k in sorted(program.dialects)))
    if program.symbols:
        lines.append("symbols:")
        for name in sorted(program.symbols):
            s = program.symbols[name]
            hint = "" if s.hint is None else f" = {s.hint}"
            lines.append(f"{INDENT}{name}{hint} in [{_bound(s.min, '-inf')}, {_bound(s.max, 'inf')}]")
    if program.guards:
        lines.append("guards:")
        lines.extend(INDENT + g for g in program.guards)
    if program.weights:
        lines.append("weights:")
        for name in sorted(program.weights):
            lines.append(f"{INDENT}{name!r}: {format_type(program.weights[name].meta)}")
    names = [program.entry] if program.entry in program.graphs else []
    names += sorted(n for n in program.graphs if n != program.entry)
    for name in names:
        lines.append("")
        if name == program.entry and len(program.graphs) > 1:
            lines.append("# entry")
        lines.extend(graph_lines(program.graphs[name]))
    return "\n".join(lines) + "\n"

