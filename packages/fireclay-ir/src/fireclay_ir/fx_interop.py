"""torch.fx interop, both ways: ``from_fx(graph_module) -> Program`` and ``to_fx(program)``.

This is the only module of fireclay-ir that uses torch.fx (it imports torch lazily, so the
package imports without torch).

``from_fx`` maps ``call_function`` targets that are ATen overloads to the ``aten`` dialect,
other torch-level callables to the ``torch`` dialect (by their public name), ``call_method``
to ``torch::Tensor.<name>``, ``operator.getitem`` on a multi-output node to that output Value,
``get_attr`` tensors to parameter/buffer/constant inputs backed by ``Program.weights``, and
``torch.ops.higher_order.cond`` to ``hop::cond``. ``call_module`` is inlined (the module is
traced with ``torch.fx.symbolic_trace``). Tensor metadata comes from ``node.meta["val"]`` (or
``"tensor_meta"``), or, when ``example_inputs`` are given, from running each node on meta
tensors. ``node.meta["stack_trace"]`` becomes the node's ``source``.

``to_fx`` builds a ``GraphModule`` whose weights are its parameters and buffers; symbolic
arguments become ``sym_size`` calls and Python arithmetic on them.
"""

from __future__ import annotations

import ast
import operator
import re
from typing import Any

from fireclay_ir.fx_private_calls import public_form
from fireclay_ir.model import (
    Device,
    DType,
    Graph,
    GraphRef,
    InputSpec,
    IRError,
    Layout,
    MemoryFormat,
    Program,
    ScalarType,
    SymExpr,
    TensorMeta,
    Value,
    Weight,
)

_FRAME = re.compile(r'File "([^"]+)", line (\d+), in [^\n]*\n\s*(.*)')


class FxConversionError(IRError):
    """An fx graph (or program) uses something the other side cannot express."""


def _torch() -> Any:
    import torch

    return torch


# --------------------------------------------------------------------------- fx -> Program


def _dim(d: Any) -> int | str:
    if isinstance(d, int):
        return d
    text = str(d)
    try:
        return int(text)
    except ValueError:
        return text


def _dtype_name(dtype: Any) -> str:
    return str(dtype).replace("torch.", "")


def _tensor_meta(val: Any, device: str) -> TensorMeta:
    torch = _torch()
    dev = str(val.device)
    if dev == "meta":
        dev = device
    strides = tuple(_dim(s) for s in val.stride()) if val.layout == torch.strided else None
    return TensorMeta(_dtype_name(val.dtype), tuple(_dim(s) for s in val.shape), strides,
                      _dim(val.storage_offset()) if val.layout == torch.strided else 0, dev,
                      bool(val.requires_grad))


def _type_of(val: Any, device: str) -> TensorMeta | ScalarType:
    torch = _torch()
    if isinstance(val, torch.Tensor):
        return _tensor_meta(val, device)
    if isinstance(val, (bool, torch.SymBool)):
        return ScalarType("bool")
    if isinstance(val, (int, torch.SymInt)):
        return ScalarType("int")
    if isinstance(val, (float, torch.SymFloat)):
        return ScalarType("float")
    return ScalarType("opaque")


def _tensor_meta_val(node: Any) -> Any:
    """A meta tensor standing for ``node.meta["tensor_meta"]`` (when ``val`` is absent)."""
    torch = _torch()
    tm = node.meta.get("tensor_meta")
    if tm is None or not hasattr(tm, "shape"):
        return None
    return torch.empty_strided(tuple(tm.shape), tuple(tm.stride), dtype=tm.dtype, device="meta",
                               requires_grad=bool(tm.requires_grad))


def _as_meta(x: Any) -> Any:
    torch = _torch()
    if isinstance(x, torch.Tensor):
        if x.device.type == "meta":
            return x
        return torch.empty_strided(tuple(x.shape), tuple(x.stride()), dtype=x.dtype, device="meta",
                                   requires_grad=x.requires_grad)
    if isinstance(x, (list, tuple)):
        return type(x)(_as_meta(a) for a in x)
    return x


def _on_meta_device(a: Any) -> Any:
    torch = _torch()
    if isinstance(a, torch.device):
        return torch.device("meta")
    if isinstance(a, (list, tuple)):
        return type(a)(_on_meta_device(x) for x in a)
    if isinstance(a, dict):
        return {k: _on_meta_device(v) for k, v in a.items()}
    return a


def _source_of(fx_node: Any) -> dict[str, Any]:
    meta: dict[str, Any] = {}
    trace = fx_node.meta.get("stack_trace")
    if trace:
        frames = _FRAME.findall(trace)
        if frames:
            file, line, text = frames[-1]
            meta["source"] = {"file": file, "line": int(line), "text": text.strip()}
    stack = fx_node.meta.get("nn_module_stack")
    if stack:
        path = list(stack.values())[-1]
        if isinstance(path, tuple) and path and isinstance(path[0], str):
            meta["module"] = path[0].replace("L['self'].", "").replace("L__self___", "")
    return meta


class _FromFx:
    def __init__(self, program: Program, device: str):
        self.program = program
        self.device = device
        self.torch = _torch()
        self._weight_ids: dict[int, str] = {}
        # Meta value of every Value created, so an inlined module can hand its results back.
        self._value_meta: dict[int, Any] = {}

    def convert(self, gm: Any, graph: Graph, inputs: list[tuple[Any, Any]] | None,
                example_inputs: list[Any] | None, prefix: str = "") -> list[Any]:
        """Convert ``gm``'s graph into ``graph``. ``inputs`` (ir arg, meta value) pairs bind the
        placeholders when inlining; otherwise placeholders become graph inputs."""
        ir: dict[Any, Any] = {}
        metas: dict[Any, Any] = {}
        placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
        if example_inputs is not None and len(example_inputs) != len(placeholders):
            raise FxConversionError(f"the graph has {len(placeholders)} placeholders but "
                                    f"{len(example_inputs)} example inputs were given")
        ph_index = 0
        for node in gm.graph.nodes:
            if node.op == "placeholder":
                if inputs is not None:
                    ir[node], metas[node] = inputs[ph_index]
                else:
                    val = self._known_val(node)
                    if val is None and example_inputs is not None:
                        val = _as_meta(example_inputs[ph_index])
                    if val is None:
                        raise FxConversionError(
                            f"placeholder {node.name!r} has no tensor metadata (node.meta['val']); "
                            "pass example_inputs to from_fx")
                    ir[node] = graph.add_input(node.name, _type_of(val, self.device))
                    metas[node] = val
                ph_index += 1
            elif node.op == "get_attr":
                ir[node], metas[node] = self._get_attr(gm, node, graph, prefix)
            elif node.op == "call_module":
                mod = gm.get_submodule(node.target)
                if not node.users and node.target.startswith("_guards"):
                    continue  # exported graphs' input guard checks: facts for the capturer, no value
                ir[node], metas[node] = self._inline_module(mod, node, ir, metas, graph, prefix)
            elif node.op in ("call_function", "call_method"):
                ir[node], metas[node] = self._call(gm, node, ir, metas, graph, prefix)
            elif node.op == "output":
                out = node.args[0]
                outs = list(out) if isinstance(out, (list, tuple)) else [out]
                return [self._arg(a, ir) for a in outs]
        raise FxConversionError("the fx graph has no output node")

    def _known_val(self, node: Any) -> Any:
        # "val": exported and make_fx graphs; "example_value": TorchDynamo's graphs (baseline-ok: fx interop reads them).
        val = node.meta.get("val", node.meta.get("example_value"))
        if val is None:
            val = _tensor_meta_val(node)
        return val

    def _get_attr(self, gm: Any, node: Any, graph: Graph, prefix: str) -> tuple[Any, Any]:
        torch = self.torch
        obj = gm
        for part in node.target.split("."):
            obj = getattr(obj, part)
        if isinstance(obj, torch.fx.GraphModule):
            return self._subgraph(obj, prefix + node.target), None
        if not isinstance(obj, torch.Tensor):
            raise FxConversionError(f"get_attr {node.target!r} is a {type(obj).__name__}, not a tensor")
        target = prefix + node.target
        known = self._weight_ids.get(id(obj))
        if known is not None:
            # The same tensor reached twice (tied weights): one weight, one input.
            for v, s in zip(graph.inputs, graph.input_specs):
                if s.target == known:
                    return v, _as_meta(obj)
        buffers = {id(b) for b in gm.buffers()}
        kind = "parameter" if isinstance(obj, torch.nn.Parameter) else \
            ("buffer" if id(obj) in buffers else "constant")
        meta = _tensor_meta(obj.detach(), str(obj.device))
        meta = meta.with_(requires_grad=bool(obj.requires_grad))
        # The tensor itself, not a copy: interpreting the program then trains the same weights.
        self.program.weights[target] = Weight(meta, obj)
        self._weight_ids[id(obj)] = target
        value = graph.add_input(node.name, meta, InputSpec(kind, target))
        return value, _as_meta(obj)

    def _subgraph(self, sub: Any, name_hint: str) -> GraphRef:
        base = re.sub(r"[^A-Za-z0-9_]", "_", name_hint) or "subgraph"
        name, k = base, 1
        while name in self.program.graphs:
            name, k = f"{base}_{k}", k + 1
        g = self.program.add_graph(Graph(name))
        outs = self.convert(sub, g, None, None, prefix=name_hint + ".")
        g.set_outputs(outs)
        return GraphRef(name)

    def _inline_module(self, mod: Any, node: Any, ir: dict[Any, Any], metas: dict[Any, Any], graph: Graph, prefix: str) -> Any:
        torch = self.torch
        try:
            sub = mod if isinstance(mod, torch.fx.GraphModule) else torch.fx.symbolic_trace(mod)
        except Exception as exc:
            raise FxConversionError(
                f"call_module {node.target!r} ({type(mod).__name__}) could not be inlined: torch.fx cannot "
                f"trace it ({type(exc).__name__}: {str(exc).splitlines()[0]}); export the model with "
                "torch.export instead, or trace it with a Tracer that does not keep it a leaf") from exc  # baseline-ok: advice to the user
        if node.kwargs:
            raise FxConversionError(f"call_module {node.target!r} with keyword arguments is not supported")
        inputs = [(self._arg(a, ir), self._arg(a, metas)) for a in node.args]
        outs = self.convert(sub, graph, inputs, None, prefix=prefix + node.target + ".")
        # The module's own meta results come from its converted output values.
        result = outs[0] if len(outs) == 1 else tuple(outs)
        return result, self._meta_of_ir(result, metas)

    def _meta_of_ir(self, result: Any, metas: dict[Any, Any]) -> Any:
        # Values created while inlining have their meta recorded by id.
        if isinstance(result, tuple):
            return tuple(self._meta_of_ir(r, metas) for r in result)
        return self._value_meta.get(id(result)) if isinstance(result, Value) else result

    def _arg(self, a: Any, env: dict[Any, Any]) -> Any:
        torch = self.torch
        if isinstance(a, torch.fx.Node):
            if a not in env:
                raise FxConversionError(f"fx node {a.name!r} is used before it is defined")
            return env[a]
        if isinstance(a, (list, tuple)):
            return type(a)(self._arg(x, env) for x in a)
        if isinstance(a, dict):
            return {k: self._arg(v, env) for k, v in a.items()}
        if isinstance(a, slice):
            return slice(self._arg(a.start, env), self._arg(a.stop, env), self._arg(a.step, env))
        return a

    def _atom(self, a: Any) -> Any:
        """An fx constant argument as an IR atom."""
        torch = self.torch
        if isinstance(a, Value) or a is None or isinstance(a, (bool, int, float, str, complex)) or a is Ellipsis:
            return a
        if isinstance(a, (list, tuple)):
            return type(a)(self._atom(x) for x in a)
        if isinstance(a, dict):
            return {k: self._atom(v) for k, v in a.items()}
        if isinstance(a, slice):
            return slice(self._atom(a.start), self._atom(a.stop), self._atom(a.step))
        if isinstance(a, torch.dtype):
            return DType(_dtype_name(a))
        if isinstance(a, torch.device):
            return Device(str(a))
        if isinstance(a, torch.layout):
            return Layout(str(a).replace("torch.", ""))
        if isinstance(a, torch.memory_format):
            return MemoryFormat(str(a).replace("torch.", ""))
        if isinstance(a, GraphRef):
            return a
        if isinstance(a, torch.SymInt):
            return SymExpr(str(a))
        raise FxConversionError(f"argument {a!r} of type {type(a).__name__} has no IR form")

    def _op_name(self, node: Any, args: tuple[Any, ...]) -> tuple[str, bool]:
        """The IR op for an fx call, and whether it is a getitem to resolve statically."""
        torch = self.torch
        from fireclay_ir.dialects.torch import name_of

        if node.op == "call_method":
            return f"torch::Tensor.{node.target}", False
        target = node.target
        if target is operator.getitem and isinstance(args[0], tuple):
            return "", True
        if isinstance(target, torch._ops.OpOverloadPacket):
            target = target.default
        if isinstance(target, torch._ops.OpOverload):
            ns = target.namespace
            if ns != "aten":
                raise FxConversionError(f"op {target} is in namespace {ns!r}; only aten ops map to the IR")
            return f"aten::{target._schema.name.split('::', 1)[1]}.{target._overloadname}", False
        if isinstance(target, torch._ops.HigherOrderOperator):
            if target.name() in ("cond", "while_loop"):
                return f"hop::{target.name()}", False
            raise FxConversionError(f"higher-order op {target.name()} has no IR form yet")
        if target is getattr:
            return f"torch::Tensor.{args[1]}", False
        name = name_of(target)
        if name is None:
            raise FxConversionError(f"fx target {getattr(target, '__qualname__', target)!r} is not a "
                                    "public torch, operator or math callable; register it with "
                                    "fireclay_ir.dialects.register_callable")
        return f"torch::{name}", False

    def _call(self, gm: Any, node: Any, ir: dict[Any, Any], metas: dict[Any, Any], graph: Graph, prefix: str) -> Any:
        args = self._arg(tuple(node.args), ir)
        kwargs = self._arg(dict(node.kwargs), ir)
        public = public_form(node.target) if node.op == "call_function" else None
        if public is not None:  # a private C function TorchDynamo recorded: its public wrapper
            op, static_getitem = f"torch::{public.name}", False
            args, kwargs = public.arguments(args, kwargs)
        else:
            op, static_getitem = self._op_name(node, args)
        meta_val = self._known_val(node)
        if static_getitem:
            return args[0][args[1]], (meta_val if meta_val is not None else metas[node.args[0]][node.args[1]])
        if meta_val is None and "_assert" in str(node.target):
            pass  # runtime checks of the real inputs (device included): no value to infer
        elif meta_val is None:
            # Factory calls name their device; on meta tensors everything must be on meta.
            meta_args = _on_meta_device(self._arg(tuple(node.args), metas))
            meta_kwargs = _on_meta_device(self._arg(dict(node.kwargs), metas))
            try:
                if node.op == "call_method":
                    meta_val = getattr(meta_args[0], node.target)(*meta_args[1:], **meta_kwargs)
                else:
                    meta_val = node.target(*meta_args, **meta_kwargs)
            except Exception as exc:
                raise FxConversionError(f"could not infer the result of fx node {node.name!r} "
                                        f"({node.format_node()}) on meta tensors: {exc}") from exc
        if op.startswith("torch::Tensor.") and node.target is getattr:
            args = args[:1]
        if op == "hop::cond":
            pred, true_ref, false_ref, operands = args
            args = (pred, true_ref, false_ref, list(operands))
        elif op == "hop::while_loop":
            cond_ref, body_ref, carried, additional = (list(args) + [()])[:4]
            args = (cond_ref, body_ref, list(carried), list(additional))
        meta = _source_of(node)
        multi = isinstance(meta_val, (list, tuple))
        outs = [_type_of(v, self.device) for v in meta_val] if multi else \
            ([] if meta_val is None else _type_of(meta_val, self.device))
        result = graph.call(op, self._atom(tuple(args)), self._atom(kwargs), out=outs,
                            name=node.name, meta=meta)
        if isinstance(result, Value):
            self._value_meta[id(result)] = meta_val
        elif multi:
            for r, m in zip(result, meta_val):
                self._value_meta[id(r)] = m
        return result, meta_val


def from_fx(gm: Any, example_inputs: Any = None, *, name: str = "main") -> Program:
    """Convert a ``torch.fx.GraphModule`` into a Program (entry graph ``name``)."""
    torch = _torch()
    if not isinstance(gm, torch.fx.GraphModule):
        raise FxConversionError(f"from_fx takes a torch.fx.GraphModule, got {type(gm).__name__}")
    examples = list(example_inputs) if example_inputs is not None else None
    device = "cpu"
    for x in (examples or []):
        if isinstance(x, torch.Tensor):
            device = str(x.device)
            break
    from fireclay_ir import __version__

    program = Program(producer=("fireclay-ir", __version__))
    program.metadata["from_fx"] = {"class": type(gm).__name__, "torch": torch.__version__.split("+")[0]}
    conv = _FromFx(program, device)
    graph = Graph(name)
    program.graphs[name] = graph
    program.entry = name
    outs = conv.convert(gm, graph, None, examples)
    graph.set_outputs(outs)
    _record_symbols(program, gm, examples)
    program.dialects = {d: _dialect_version(d) for d in sorted(_dialects_used(program))}
    return program


def _record_symbols(program: Program, gm: Any, examples: list[Any] | None) -> None:
    """Add every plain symbol of the user inputs' shapes to ``program.symbols``, with the size
    it had in the example inputs (or in the graph's own example values) as its hint."""
    torch = _torch()
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    user = [v for v, s in zip(program.main.inputs, program.main.input_specs) if s.kind == "user"]
    for i, (node, value) in enumerate(zip(placeholders, user)):
        if not isinstance(value.type, TensorMeta):
            continue
        example = examples[i] if examples is not None else node.meta.get("val", node.meta.get("example_value"))
        sizes = tuple(example.shape) if isinstance(example, torch.Tensor) else (None,) * value.type.rank
        for dim, size in zip(value.type.shape, sizes):
            if isinstance(dim, str) and dim.isidentifier() and dim not in program.symbols:
                hint = size if isinstance(size, int) else _symint_hint(size)
                program.add_symbol(dim, hint=hint)


def _symint_hint(size: Any) -> int | None:
    # A SymInt from a fake tensor knows the size it was traced with; ask without guarding.
    hint = getattr(getattr(size, "node", None), "hint", None)
    return hint if isinstance(hint, int) else None


def _dialects_used(program: Program) -> set[str]:
    return {n.dialect for g in program.graphs.values() for n in g.nodes}


def _dialect_version(name: str) -> str:
    from fireclay_ir.dialects import get_dialect

    return get_dialect(name).version


# --------------------------------------------------------------------------- Program -> fx


class _ToFx:
    def __init__(self, program: Program):
        self.torch = _torch()
        self.program = program
        self.attrs: dict[str, Any] = {}
        self._condition_graphs = {
            n.args[0].name for g in program.graphs.values() for n in g.nodes
            if n.op == "hop::while_loop" and n.args and isinstance(n.args[0], GraphRef)}

    def build(self, graph: Graph, attr_prefix: str = "", single_output: bool = False) -> Any:
        torch = self.torch
        fx = torch.fx.Graph()
        env: dict[Value, Any] = {}
        sym_nodes: dict[str, Any] = {}
        for v, spec in zip(graph.inputs, graph.input_specs):
            if spec.kind == "user":
                env[v] = fx.placeholder(v.name)
                if isinstance(v.type, TensorMeta):
                    for i, d in enumerate(v.type.shape):
                        if isinstance(d, str) and d.isidentifier() and d not in sym_nodes:
                            sym_nodes[d] = fx.call_function(torch.ops.aten.sym_size.int, (env[v], i))
            else:
                target = spec.target or ""
                weight = self.program.weights.get(target)
                if weight is None or weight.data is None:
                    raise FxConversionError(f"input %{v.name} needs weight {spec.target!r}, which the "
                                            "program does not hold")
                data = weight.data
                if spec.kind == "parameter":
                    data = torch.nn.Parameter(data, requires_grad=weight.meta.requires_grad)
                self.attrs[target] = data
                env[v] = fx.get_attr(target)

        def arg(a: Any) -> Any:
            if isinstance(a, Value):
                return env[a]
            if isinstance(a, list):
                return [arg(x) for x in a]
            if isinstance(a, tuple):
                return tuple(arg(x) for x in a)
            if isinstance(a, dict):
                return {k: arg(x) for k, x in a.items()}
            if isinstance(a, slice):
                return slice(arg(a.start), arg(a.stop), arg(a.step))
            if isinstance(a, SymExpr):
                return _sym_to_fx(fx, a.expr, sym_nodes)
            if isinstance(a, (DType, Layout, MemoryFormat)):
                return getattr(torch, a.name)
            if isinstance(a, Device):
                return torch.device(a.name)
            if isinstance(a, GraphRef):
                sub_name = f"{attr_prefix}{a.name}"
                if sub_name not in self.attrs:
                    self.attrs[sub_name] = None  # reserve against recursion
                    sub = self.build(self.program.graphs[a.name], attr_prefix,
                                     single_output=a.name in self._condition_graphs)
                    sub_attrs = {k: v for k, v in self.attrs.items() if v is not None}
                    self.attrs[sub_name] = torch.fx.GraphModule(_attr_root(sub_attrs), sub)
                return fx.get_attr(sub_name)
            return a

        for node in graph.nodes:
            args, kwargs = arg(list(node.args)), arg(dict(node.kwargs))
            call = self._emit(fx, node, args, kwargs)
            if call is not None:
                call.meta["fireclay.meta"] = dict(node.meta)
                src = node.source
                if src:
                    call.meta["stack_trace"] = (f'  File "{src.get("file", "?")}", line {src.get("line", 0)}, '
                                                f'in <fireclay>\n    {src.get("text", "")}\n')
            self._bind_outputs(fx, node, call, env)
        outputs = tuple(arg(list(graph.outputs)))
        # A while_loop condition returns its bool itself, not a one-element tuple.
        fx.output(outputs[0] if single_output and len(outputs) == 1 else outputs)
        return fx

    def _root(self) -> Any:
        return self.torch.nn.Module()

    def _emit(self, fx: Any, node: Any, args: list[Any], kwargs: dict[str, Any]) -> Any:
        torch = self.torch
        from fireclay_ir.dialects import lookup_op

        op = lookup_op(node.op)
        if node.dialect == "aten":
            return fx.call_function(op.target(), tuple(args), kwargs)
        if node.dialect == "torch":
            root, _, attr = node.target.rpartition(".")
            if op.is_property:
                return fx.call_function(getattr, (args[0], attr))
            if root == "Tensor" and not op.in_process_only:
                return fx.call_method(attr, tuple(args), kwargs)
            return fx.call_function(op.target(), tuple(args), kwargs)
        from fireclay_ir.dialects.hop import bind_arguments

        vals = bind_arguments(node.target, args, kwargs) if node.dialect == "hop" else {}
        if node.op == "hop::cond":
            return fx.call_function(torch.ops.higher_order.cond,
                                    (vals["pred"], vals["true_graph"], vals["false_graph"],
                                     tuple(vals["operands"])))
        if node.op == "hop::while_loop":
            return fx.call_function(torch.ops.higher_order.while_loop,
                                    (vals["cond_graph"], vals["body_graph"], tuple(vals["carried"]),
                                     tuple(vals.get("additional", ()))))
        if node.op == "hop::checkpoint":
            target = vals["body"].target
            return fx.call_module(target, tuple(vals["operands"]))
        raise FxConversionError(f"{node.op} has no torch.fx form (supported: aten, torch, hop::cond, "
                                "hop::while_loop, hop::checkpoint)")

    def _bind_outputs(self, fx: Any, node: Any, call: Any, env: dict[Any, Any]) -> None:
        outs = node.outputs
        if not outs:
            return
        returns_sequence = node.dialect == "hop" or len(outs) > 1
        if node.dialect == "aten" and len(outs) == 1:
            from fireclay_ir.dialects import lookup_op

            rets = lookup_op(node.op).returns or ()
            returns_sequence = len(rets) > 1 or any(r.type.endswith("[]") for r in rets)
        if not returns_sequence:
            env[outs[0]] = call
            return
        for i, v in enumerate(outs):
            env[v] = fx.call_function(operator.getitem, (call, i))


_SYM_BINOPS = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul,
               ast.FloorDiv: operator.floordiv, ast.Mod: operator.mod, ast.Pow: operator.pow}


def _sym_to_fx(fx: Any, expr: str, sym_nodes: dict[str, Any]) -> Any:
    """Emit Python arithmetic on ``sym_size`` nodes computing ``expr``."""
    torch = _torch()
    from fireclay_ir.interpreter import _parse_expr

    def emit(n: ast.AST) -> Any:
        if isinstance(n, ast.Expression):
            return emit(n.body)
        if isinstance(n, ast.Constant) and isinstance(n.value, int):
            return n.value
        if isinstance(n, ast.Name):
            if n.id not in sym_nodes:
                raise FxConversionError(f"symbol {n.id!r} of {expr!r} is not the size of any input")
            return sym_nodes[n.id]
        if isinstance(n, ast.BinOp) and type(n.op) in _SYM_BINOPS:
            return fx.call_function(_SYM_BINOPS[type(n.op)], (emit(n.left), emit(n.right)))
        if isinstance(n, ast.UnaryOp) and isinstance(n.op, ast.USub):
            return fx.call_function(operator.neg, (emit(n.operand),))
        if isinstance(n, ast.Call) and isinstance(n.func, ast.Name):
            fns = {"Max": torch.sym_max, "Min": torch.sym_min, "FloorDiv": operator.floordiv,
                   "Mod": operator.mod}
            if n.func.id in fns and len(n.args) == 2:
                return fx.call_function(fns[n.func.id], tuple(emit(a) for a in n.args))
        raise FxConversionError(f"symbolic expression {expr!r} has no torch.fx form")

    return emit(_parse_expr(expr))


def to_fx(program: Program) -> Any:
    """A ``torch.fx.GraphModule`` computing ``program``'s entry graph; returns a tuple."""
    torch = _torch()
    conv = _ToFx(program)
    fx_graph = conv.build(program.main)
    gm = torch.fx.GraphModule(_attr_root(conv.attrs), fx_graph)
    gm.recompile()
    return gm


def _attr_root(attrs: dict[str, Any]) -> Any:
    torch = _torch()
    root = torch.nn.Module()
    for path, obj in attrs.items():
        holder = root
        *parents, leaf = path.split(".")
        for p in parents:
            if not hasattr(holder, p):
                holder.add_module(p, torch.nn.Module())
            holder = getattr(holder, p)
        if isinstance(obj, torch.nn.Parameter):
            holder.register_parameter(leaf, obj)
        elif isinstance(obj, torch.nn.Module):
            holder.add_module(leaf, obj)
        else:
            holder.register_buffer(leaf, obj)
    return root
