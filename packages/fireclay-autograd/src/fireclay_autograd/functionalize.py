"""Functionalization: turn a recorded (imperative) aten graph into pure dataflow.

The tracer's graph says what happened, in order: ``v = view(x); add_(v, 1)`` writes into ``x``.
Here every tensor is followed back to its *base* (the tensor that owns the storage) and the
*view chain* that leads from the base to it. Then:

* an in-place op ``op_(t, ...)`` becomes its functional form ``t2 = op(t, ...)``; when ``t`` is a
  view, ``t2`` is scattered back into its base through the inverse of each view
  (``slice_scatter``, ``select_scatter``, an inverse ``permute``, a reshape...), giving the
  base a new version;
* a later read of any alias of a base that changed is regenerated from the base's latest
  version by replaying its view chain;
* the final version of every mutated graph input is returned as an extra output, for the
  runtime to copy into the real input once, at the end;
* outputs that alias an input, or alias each other, are reported with their view chains so
  the runtime can hand back real views, as eager does.

No in-place op remains in the result. View ops that are not written through remain (they are
core ops, and cheap): their results are never mutated, so they carry no aliasing hazard.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch
from torch.utils import _pytree as pytree

from fireclay_autograd.convert import evaluate, from_ir_atom, same_dims, scalar_type, tensor_meta, to_ir_atom
from fireclay_autograd.custom_ops import functional_form
from fireclay_autograd.executor import aten_overload, op_name
from fireclay_autograd.fake import FakeMode, FakeTensor, fake_of_meta, mode_for, torch_dim
from fireclay_autograd.tracer import functional_variant
from fireclay_ir import DType, Graph, IRError, Node, SymExpr, Value, iter_values, map_values

# In-place ops that only change a tensor's metadata, by overload (their arguments differ: squeeze_
# takes no dim, an int or a list); they rebind the tensor to this view of itself.
_METADATA_MUTATIONS = {
    "t_.default": "aten::permute.default",
    "transpose_.default": "aten::transpose.int",
    "unsqueeze_.default": "aten::unsqueeze.default",
    "squeeze_.default": "aten::squeeze.default",
    "squeeze_.dim": "aten::squeeze.dim",
    "squeeze_.dims": "aten::squeeze.dims",
    "as_strided_.default": "aten::as_strided.default",
}
# Views whose inverse is "reshape back to the base's shape".
_RESHAPING_VIEWS = frozenset({
    "aten::view.default", "aten::_unsafe_view.default", "aten::unsqueeze.default", "aten::squeeze.dim",
    "aten::squeeze.dims", "aten::squeeze.default", "aten::reshape.default", "aten::flatten.using_ints",
    "aten::unflatten.int", "aten::view_as.default",
})
_IDENTITY_VIEWS = frozenset({"aten::alias.default", "aten::detach.default", "aten::lift_fresh.default"})


@dataclass(frozen=True)
class ViewStep:
    """One single-output view op applied to the previous tensor of a chain."""

    op: str
    args: tuple = ()
    kwargs: tuple = ()  # (name, value) pairs, so steps are hashable and comparable

    def apply(self, x: torch.Tensor, symbols: dict[str, int] | None = None) -> torch.Tensor:
        """Replay the step on a real tensor (the runtime regenerates aliasing outputs so);
        symbolic sizes among its arguments take their values from ``symbols``."""
        overload = aten_overload(self.op)

        def conv(a: Any) -> Any:
            if isinstance(a, SymExpr):
                return evaluate(a.expr, symbols or {})
            return from_ir_atom(a)

        return overload(x, *pytree.tree_map(conv, list(self.args)), **{k: conv(v) for k, v in self.kwargs})


@dataclass
class OutputAlias:
    """How a user output aliases something: ``kind`` is ``"input"`` (``index`` is the graph
    input it views), ``"intermediate"`` (``index`` is the position, among the extra base
    outputs, of the intermediate it views) or ``"output"`` (``index`` is the user output that
    is its base); ``chain`` turns that tensor into the output."""

    kind: str
    index: int
    chain: tuple[ViewStep, ...]


@dataclass
class FunctionalGraph:
    """A functionalized graph. Its outputs are, in order: the ``num_user_outputs`` user
    outputs; the new values of ``mutated_inputs`` (graph input indices); the bases that
    ``output_aliases`` of kind ``intermediate`` refer to."""

    graph: Graph
    num_user_outputs: int
    mutated_inputs: list[int] = field(default_factory=list)
    output_aliases: list[OutputAlias | None] = field(default_factory=list)
    num_intermediate_bases: int = 0
    num_hidden_outputs: int = 0  # trailing user outputs that are bases only (see OutputPlan)


class _Base:
    __slots__ = ("current", "version", "input_index")

    def __init__(self, current: Value, input_index: int | None):
        self.current = current
        self.version = 0
        self.input_index = input_index


class _Alias:
    __slots__ = ("base", "chain", "value", "version")

    def __init__(self, base: _Base, chain: tuple[ViewStep, ...], value: Value, version: int):
        self.base, self.chain, self.value, self.version = base, chain, value, version


class _Functionalizer:
    def __init__(self, source: Graph, regenerate_aliases: bool = True, mode: FakeMode | None = None,
                 output_bases: bool = False):
        self.source = source
        self.regenerate_aliases = regenerate_aliases
        self.output_bases = output_bases
        self.mode = mode if mode is not None else mode_for()
        self.graph = Graph(source.name)
        self.graph.meta = dict(source.meta)
        self.env: dict[Value, Any] = {}
        self.fakes: dict[Value, FakeTensor] = {}
        self._meta: dict[str, Any] = {}

    # -- emitting nodes with inferred types
    def emit(self, op: str, args: tuple, kwargs: dict, known: list[Any] | None = None) -> list[Value]:
        """Add ``op`` to the new graph. Its output types are ``known`` when given (see
        :meth:`recorded_types`), else inferred by running the op on fakes."""
        if known is not None:
            return list(self.graph.call(op, args, kwargs, out=known, meta=dict(self._meta)))
        overload = aten_overload(op)
        fake_args = map_values(args, self._fake)
        fake_kwargs = map_values(kwargs, self._fake)

        def conv(a: Any) -> Any:
            return torch_dim(a.expr, self.mode) if isinstance(a, SymExpr) else from_ir_atom(a)

        out = self.mode.run(overload, pytree.tree_map(conv, fake_args), pytree.tree_map(conv, fake_kwargs))
        flat = list(out) if isinstance(out, (tuple, list)) else [out]
        types = [tensor_meta(o) if isinstance(o, FakeTensor) else scalar_type(o) for o in flat]
        values = self.graph.call(op, args, kwargs, out=types, meta=dict(self._meta))
        for v, o in zip(values, flat):
            if isinstance(o, FakeTensor):
                self.fakes[v] = o
        return list(values)

    @staticmethod
    def recorded_types(node: Node, args: Any, kwargs: Any) -> list[Any] | None:
        """The traced node's own output types, when its tensor arguments here have exactly the
        types they had in the trace: an op's output metadata follows from its inputs' metadata
        and its other arguments, so running it on fakes again would give the same types. That
        holds for every node no in-place write reaches, most of a graph, and spares a second
        run of each op's meta kernel. None (infer them) otherwise."""
        if not node.outputs or not all(o.is_tensor for o in node.outputs):
            return None
        before = list(iter_values((node.args, node.kwargs)))
        after = list(iter_values((args, kwargs)))
        if len(before) != len(after) or any(a.type != b.type for a, b in zip(before, after)):
            return None
        return [o.type for o in node.outputs]

    def emit1(self, op: str, *args: Any, **kwargs: Any) -> Value:
        return self.emit(op, args, kwargs)[0]

    def _fake(self, v: Value) -> FakeTensor:
        fake = self.fakes.get(v)
        if fake is None:
            fake = fake_of_meta(v.meta, self.mode)
            self.fakes[v] = fake
        return fake

    # -- reading and writing aliases
    def read(self, alias: _Alias) -> Value:
        if alias.version != alias.base.version:
            v = alias.base.current
            for step in alias.chain:
                v = self.emit1(step.op, v, *step.args, **dict(step.kwargs))
            alias.value, alias.version = v, alias.base.version
        return alias.value

    def write(self, alias: _Alias, new: Value) -> None:
        base = alias.base
        target = self.read(alias).meta
        if new.meta.dtype != target.dtype:
            # In-place ops keep the destination's dtype; the functional form may promote.
            new = self.emit1("aten::_to_copy.default", new, dtype=DType(target.dtype))
        if not same_dims(new.meta.shape, target.shape):
            new = self.emit1("aten::expand.default", new, ir_sizes(target.shape))
        if alias.chain:
            stack = [base.current]
            for step in alias.chain[:-1]:
                stack.append(self.emit1(step.op, stack[-1], *step.args, **dict(step.kwargs)))
            value = new
            for step, below in zip(reversed(alias.chain), reversed(stack)):
                value = self.scatter(step, below, value)
            base.current = value
        else:
            base.current = new
        base.version += 1
        alias.value, alias.version = new, base.version

    def scatter(self, step: ViewStep, base: Value, src: Value) -> Value:
        """The tensor ``base`` with ``src`` written into the part that ``step`` views."""
        op, args = step.op, step.args
        if op in _IDENTITY_VIEWS:
            return src
        if op in _RESHAPING_VIEWS:
            if src.meta.strides is not None:
                src = self.emit1("aten::clone.default", src, memory_format=to_ir_atom(torch.contiguous_format))
            return self.emit1("aten::view.default", src, ir_sizes(base.meta.shape))
        if op == "aten::permute.default":
            dims = [d % len(args[0]) for d in args[0]]
            inverse = [dims.index(i) for i in range(len(dims))]
            return self.emit1("aten::permute.default", src, inverse)
        if op == "aten::transpose.int":
            return self.emit1("aten::transpose.int", src, *args)
        if op == "aten::slice.Tensor":
            return self.emit1("aten::slice_scatter.default", base, src, *args)
        if op == "aten::select.int":
            return self.emit1("aten::select_scatter.default", base, src, *args)
        if op == "aten::diagonal.default":
            return self.emit1("aten::diagonal_scatter.default", base, src, *args)
        if op == "aten::as_strided.default":
            return self.emit1("aten::as_strided_scatter.default", base, src, *args)
        raise IRError(f"writing in place through a view made by {op} is not supported; "
                      f"clone the tensor before mutating it")

    # -- the walk
    def run(self, num_user_outputs: int | None) -> FunctionalGraph:
        for i, (v, spec) in enumerate(zip(self.source.inputs, self.source.input_specs)):
            new = self.graph.add_input(v.name, v.type, spec)
            if v.is_tensor:
                base = _Base(new, i)
                self.env[v] = _Alias(base, (), new, 0)
            else:
                self.env[v] = new
        for node in self.source.nodes:
            self._meta = dict(node.meta)
            self.visit(node)
        return self.finish(num_user_outputs)

    def arg(self, a: Any) -> Any:
        def fn(v: Value) -> Any:
            x = self.env.get(v)
            if x is None:
                raise IRError(f"%{v.name} is read before it is defined")
            return self.read(x) if isinstance(x, _Alias) else x

        return map_values(a, fn)

    def visit(self, node: Node) -> None:
        overload = aten_overload(node.op)
        schema = overload._schema
        writes = [i for i, a in enumerate(schema.arguments) if a.alias_info is not None and a.alias_info.is_write]
        if writes:
            self.visit_mutation(node, overload, writes)
        elif any(r.alias_info is not None for r in schema.returns):
            self.visit_view(node)
        else:
            args, kwargs = self.arg(node.args), self.arg(node.kwargs)
            outs = self.emit(node.op, args, kwargs, self.recorded_types(node, args, kwargs))
            self.bind_fresh(node, outs)

    def bind_fresh(self, node: Node, outs: list[Value]) -> None:
        for old, new in zip(node.outputs, outs):
            if old.is_tensor and new.is_tensor:
                self.env[old] = _Alias(_Base(new, None), (), new, 0)
            else:
                self.env[old] = new

    def visit_view(self, node: Node) -> None:
        source = self.env[node.args[0]]
        args, kwargs = self.arg(node.args), self.arg(node.kwargs)
        outs = self.emit(node.op, args, kwargs, self.recorded_types(node, args, kwargs))
        for k, (old, new) in enumerate(zip(node.outputs, outs)):
            step = self.view_step(node, k)
            self.env[old] = _Alias(source.base, source.chain + (step,), new, source.base.version)

    def view_step(self, node: Node, k: int) -> ViewStep:
        # Multi-output views are remembered as the single-output view giving each output.
        dim = node.args[2] if len(node.args) > 2 else node.kwargs.get("dim", 0)
        if node.op in ("aten::split_with_sizes.default", "aten::split.Tensor"):
            sizes = [o.meta.shape[dim] for o in node.outputs]
            start = _size_sum(sizes[:k])
            return ViewStep("aten::slice.Tensor", (dim, start, _size_sum(sizes[:k + 1]), 1))
        if node.op == "aten::unbind.int":
            dim = node.args[1] if len(node.args) > 1 else node.kwargs.get("dim", 0)
            return ViewStep("aten::select.int", (dim, k))
        if len(node.outputs) != 1:
            raise IRError(f"multi-output view {node.op} is not supported by functionalization")
        if any(True for _ in iter_values((node.args[1:], node.kwargs))):
            raise IRError(f"view {node.op} with tensor arguments is not supported by functionalization")
        return ViewStep(node.op, tuple(node.args[1:]), tuple(sorted(node.kwargs.items())))

    def visit_mutation(self, node: Node, overload, writes: list[int]) -> None:
        name = overload._opname
        targets = [self._written_arg(node, overload, i) for i in writes]
        view = _METADATA_MUTATIONS.get(f"{name}.{overload._overloadname}")
        if view is not None:
            alias = self.env[targets[0]]
            rank = len(node.args[0].meta.shape)
            args = [list(range(rank))[::-1]] if name == "t_" else list(node.args[1:])
            step = ViewStep(view, tuple(args), tuple(sorted(node.kwargs.items())))
            value = self.emit1(step.op, self.read(alias), *step.args, **dict(step.kwargs))
            rebound = _Alias(alias.base, alias.chain + (step,), value, alias.base.version)
            self.env[targets[0]] = rebound
            for old in node.outputs:
                self.env[old] = rebound
            return
        if overload.namespace != "aten":
            self.visit_custom_mutation(node, overload, targets)
            return
        functional = functional_variant(overload)
        extra_outputs = False
        if functional is None:
            packet = getattr(torch.ops.aten, name + "_functional", None)
            functional = getattr(packet, overload._overloadname, None) if packet is not None else None
            extra_outputs = True
        if functional is None:
            raise IRError(f"{node.op} mutates its input and has no functional form that fireclay knows")
        # Defaults of the in-place form are spelled out: the functional form may lack them.
        args = list(node.args)
        for a in overload._schema.arguments[len(args):]:
            if a.kwarg_only or a.name in node.kwargs or not a.has_default_value():
                break
            args.append(to_ir_atom(a.default_value))
        outs = self.emit(op_name(functional), self.arg(tuple(args)), self.arg(node.kwargs))
        if extra_outputs:
            n = len(node.outputs)
            self.bind_fresh(node, outs[:n])
            for target, new in zip(targets, outs[n:]):
                self.write(self.env[target], new)
            return
        self.write(self.env[targets[0]], outs[0])
        for old in node.outputs:
            self.env[old] = self.env[targets[0]]

    def visit_custom_mutation(self, node: Node, overload, targets: list[Value]) -> None:
        """A custom operator that writes into arguments becomes its functional form (see
        :mod:`fireclay_autograd.custom_ops`): the operator's results, then the written
        arguments' new values, written back where the operator wrote."""
        outs = self.emit(op_name(functional_form(overload)), self.arg(node.args), self.arg(node.kwargs))
        n = len(overload._schema.returns)  # an op returning nothing was recorded with one None result
        self.bind_fresh(node, outs[:n])
        for target, new in zip(targets, outs[n:]):
            self.write(self.env[target], new)

    def _written_arg(self, node: Node, overload, index: int) -> Value:
        arg = overload._schema.arguments[index]
        value = node.kwargs.get(arg.name) if (arg.kwarg_only or arg.name in node.kwargs) else (
            node.args[index] if index < len(node.args) else None)
        if not isinstance(value, Value):
            raise IRError(f"{node.op}: the mutated argument {arg.name!r} is not a tensor of the graph")
        return value

    def finish(self, num_user_outputs: int | None) -> FunctionalGraph:
        outputs = list(self.source.outputs)
        n_user = len(outputs) if num_user_outputs is None else num_user_outputs
        self._meta = {}
        new_outputs: list[Any] = []
        aliases: list[OutputAlias | None] = []
        bases: dict[_Base, int] = {}
        shared = self._shared_bases(outputs[:n_user]) if self.regenerate_aliases or self.output_bases else set()
        base_outputs: dict[_Base, int] = {}
        if self.output_bases:
            for i, out in enumerate(outputs[:n_user]):
                entry = self.env.get(out) if isinstance(out, Value) else None
                if isinstance(entry, _Alias) and entry.base in shared and not entry.chain:
                    base_outputs.setdefault(entry.base, i)
        extra_bases: list[Value] = []
        for i, out in enumerate(outputs):
            entry = self.env.get(out) if isinstance(out, Value) else None
            if isinstance(entry, _Alias) and i < n_user and self._is_constant(entry.base):
                # A lifted constant is a fresh tensor on every eager call (`torch.tensor(...)`):
                # the user gets a copy, never a view of the one the compiled program keeps.
                new_outputs.append(self.emit1("aten::clone.default", self.read(entry)))
                aliases.append(None)
            elif isinstance(entry, _Alias):
                new_outputs.append(self.read(entry))
                alias = None
                if i < n_user and entry.base.input_index is not None:
                    alias = OutputAlias("input", entry.base.input_index, entry.chain)
                elif i < n_user and entry.base in base_outputs:
                    if base_outputs[entry.base] != i:
                        alias = OutputAlias("output", base_outputs[entry.base], entry.chain)
                elif i < n_user and entry.base in shared and not self.output_bases:
                    if entry.base not in bases:
                        bases[entry.base] = len(extra_bases)
                        extra_bases.append(entry.base.current)
                    alias = OutputAlias("intermediate", bases[entry.base], entry.chain)
                aliases.append(alias)
            else:
                new_outputs.append(self.arg(out))
                aliases.append(None)
        mutated = []
        for v in self.source.inputs:
            entry = self.env.get(v)
            if isinstance(entry, _Alias):
                if entry.chain:
                    raise IRError(f"input %{v.name} had its shape or strides changed in place "
                                  f"(e.g. by t_()); that is not supported")
                if entry.base.version > 0 and not self._is_constant(entry.base):
                    # (a mutated constant is not written back: the next call starts from a fresh one)
                    mutated.append(entry.base.input_index)
                    new_outputs.insert(n_user + len(mutated) - 1, entry.base.current)
        self.graph.set_outputs(new_outputs + extra_bases)
        return FunctionalGraph(self.graph, n_user, mutated, aliases[:n_user], len(extra_bases))

    def _is_constant(self, base: _Base) -> bool:
        """Whether ``base`` is a lifted constant (a graph input the runtime supplies itself)."""
        return base.input_index is not None and self.source.input_specs[base.input_index].kind == "constant"

    def _shared_bases(self, outputs: list[Any]) -> set[_Base]:
        count: dict[_Base, int] = {}
        for out in outputs:
            entry = self.env.get(out) if isinstance(out, Value) else None
            if isinstance(entry, _Alias):
                count[entry.base] = count.get(entry.base, 0) + 1
        return {b for b, c in count.items() if c > 1}


def ir_sizes(shape: tuple) -> list[Any]:
    """A type's sizes as op arguments (symbolic ones as ``SymExpr``)."""
    return [SymExpr(d) if isinstance(d, str) else d for d in shape]


def _size_sum(sizes: list[Any]) -> Any:
    if all(isinstance(d, int) for d in sizes):
        return sum(sizes)
    from fireclay_shapes import dumps, parse

    total = sum((parse(d) if isinstance(d, str) else d for d in sizes), 0)
    return int(total) if getattr(total, "is_Integer", False) else SymExpr(dumps(total))


def functionalize(graph: Graph, num_user_outputs: int | None = None, *,
                  regenerate_aliases: bool = True, mode: FakeMode | None = None,
                  output_bases: bool = False) -> FunctionalGraph:
    """A pure copy of the recorded aten ``graph`` (which is left unchanged); see the module
    docstring. ``num_user_outputs``: how many leading outputs are the user's (for aliasing
    analysis); the default is all of them. ``regenerate_aliases=False`` reports no outputs
    aliasing each other. ``output_bases=True`` reports user outputs that view another user
    output (their shared base) as aliases of kind ``"output"``, and adds no base outputs (the
    training path, which makes each shared base an output itself). ``mode``: the fake mode whose
    symbols the graph's sizes use."""
    result = _Functionalizer(graph, regenerate_aliases, mode, output_bases).run(num_user_outputs)
    eliminate_dead_code(result.graph)
    return result


def eliminate_dead_code(graph: Graph) -> int:
    """Remove nodes whose outputs nobody reads (the graph is functional, so this is safe);
    returns how many were removed."""
    live: set[Value] = set(iter_values(graph.outputs))
    removed = 0
    for node in reversed(list(graph.nodes)):
        if any(o in live or o.users for o in node.outputs):
            live.update(node.inputs())
            continue
        graph.erase(node)
        removed += 1
    return removed
