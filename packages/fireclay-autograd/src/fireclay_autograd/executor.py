"""Run torch- and aten-dialect graphs on torch tensors, node by node.

This is the package's own small executor: the tracer needs to know which torch-dialect node is
running (to carry its source location onto the aten nodes it produces), which a plain
interpreter does not tell. Op names resolve only against fixed roots (never an import path), so
running a program from a file is safe; a program from someone else runs with ``limits`` (a
:class:`fireclay_ir.RunLimits`, as the reference interpreter takes): every node is a step, and on
real tensors every op is first run on the meta device, refused when its results would not fit in
``max_bytes`` beside the inputs (``fireclay_ir.run_limits.allocation_guard``).
"""

from __future__ import annotations

import math
import operator
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch

from fireclay_autograd.convert import evaluate, from_ir_atom
from fireclay_autograd.whole_calls import whole_call
from fireclay_ir import (
    Graph,
    IRError,
    Node,
    Program,
    RunLimitError,
    RunLimits,
    SymExpr,
    Value,
    lookup_op,
    map_values,
)
from fireclay_ir.dialects import custom_op_name, is_custom_op, register_custom_op
from fireclay_ir.dialects.aten import ATTENTION_BIAS_ALIGNMENT, ATTENTION_BIAS_POSITIONS

_TORCH_ROOTS: dict[str, Any] = {"torch": torch, "Tensor": torch.Tensor, "operator": operator, "math": math}
_OVERLOAD_PACKETS = {"aten": torch.ops.aten, "prims": torch.ops.prims}
_cache: dict[str, Callable] = {}


def resolve_op(op: str) -> Callable:
    """The callable behind an op name of the torch, aten or prims dialect."""
    fn = _cache.get(op)
    if fn is None:
        fn = _cache[op] = _resolve(op)
    return fn


def aten_overload(op: str) -> torch._ops.OpOverload:
    """``aten::add.Tensor`` -> ``torch.ops.aten.add.Tensor``; a custom operator
    (``aten::mylib::scale.default``) resolves only when this process registered it (see
    :func:`op_name`), never by a document's say-so."""
    dialect, _, target = op.partition("::")
    if is_custom_op(op):
        return lookup_op(op).target()
    packets = _OVERLOAD_PACKETS.get(dialect)
    if packets is None:
        raise IRError(f"{op!r} is not an aten or prims op")
    name, _, overload = target.partition(".")
    try:
        return getattr(getattr(packets, name), overload or "default")
    except (AttributeError, RuntimeError):
        raise IRError(f"unknown op {op!r}: torch {torch.__version__} has no such overload") from None


def op_name(overload: torch._ops.OpOverload) -> str:
    """``torch.ops.aten.add.Tensor`` -> ``aten::add.Tensor``. A ``torch.library`` operator of
    another namespace is a custom op of the aten dialect (``aten::mylib::scale.default``),
    registered in this process on first sight so that graphs naming it verify and run."""
    namespace = overload.namespace
    if namespace in _OVERLOAD_PACKETS:
        return f"{namespace}::{overload._opname}.{overload._overloadname}"
    name = custom_op_name(namespace, overload._opname, overload._overloadname)
    try:
        registered = lookup_op(name).resolve
    except IRError:
        registered = None
    if registered is None or registered() is not overload:
        register_custom_op(name, str(overload._schema), lambda: overload,
                           tags=tuple(str(t).split(".")[-1] for t in overload.tags))
    return name


def _resolve(op: str) -> Callable:
    dialect, _, target = op.partition("::")
    if dialect in _OVERLOAD_PACKETS or is_custom_op(op):
        return aten_overload(op)
    if dialect != "torch":
        raise IRError(f"cannot run op {op!r}: this executor knows the torch, aten and prims dialects")
    root_name, _, rest = target.partition(".")
    obj = _TORCH_ROOTS.get(root_name)
    if obj is None or not rest:
        raise IRError(f"cannot resolve torch-dialect op {op!r}: it must start with one of {sorted(_TORCH_ROOTS)}")
    path = rest.split(".")
    for part in path:
        if part.startswith("_") and part not in ("__getitem__", "__setitem__"):
            raise IRError(f"refusing private name {part!r} in op {op!r}")
        try:
            obj = getattr(obj, part)
        except AttributeError:
            raise IRError(f"torch-dialect op {op!r} does not exist in torch {torch.__version__}") from None
    if root_name == "Tensor" and isinstance(obj, (property, type(torch.Tensor.shape))):
        attr = path[-1]
        return lambda self: getattr(self, attr)
    return whole_call(obj)


def bind_symbols(graph: Graph, inputs: Sequence[Any], positions: Sequence[int] | None = None) -> dict[str, int]:
    """Symbol values read off the sizes of real ``inputs``: a dim of an input's type that is a
    bare symbol takes that input's size there (only the inputs at ``positions``, when given).
    Raises when two inputs disagree."""
    values: dict[str, int] = {}
    for i in range(len(graph.inputs)) if positions is None else positions:
        v, x = graph.inputs[i], inputs[i]
        if not v.is_tensor or not isinstance(x, torch.Tensor) or v.meta.is_static:
            continue
        if x.dim() != len(v.meta.shape):
            raise IRError(f"input %{v.name} has {x.dim()} dims, its type {list(v.meta.shape)} has "
                          f"{len(v.meta.shape)}")
        for d, size in zip(v.meta.shape, x.shape):
            if isinstance(d, str) and d.isidentifier():
                if values.setdefault(d, int(size)) != int(size):
                    raise IRError(f"symbol {d} is {values[d]} by one input and {int(size)} by "
                                  f"%{v.name}")
    return values


def _materialize(arg: Any, env: dict[Value, Any], symbols: Callable[[str], Any]) -> Any:
    def fn(v: Value) -> Any:
        try:
            return env[v]
        except KeyError:
            raise IRError(f"%{v.name} is read before it is defined") from None

    def atom(a: Any) -> Any:
        if isinstance(a, SymExpr):
            return symbols(a.expr)
        if isinstance(a, (list, tuple)):
            return type(a)(atom(x) for x in a)
        if isinstance(a, dict):
            return {k: atom(x) for k, x in a.items()}
        if isinstance(a, slice):
            return slice(atom(a.start), atom(a.stop), atom(a.step))
        return from_ir_atom(a)

    return atom(map_values(arg, fn))


_VIEWS = frozenset({"aten::view.default", "aten::_unsafe_view.default"})


def run_graph(
    graph: Graph,
    inputs: list[Any],
    *,
    on_node: Callable[[Node], Any] | None = None,
    after_node: Callable[[Node, Any], None] | None = None,
    symbols: Mapping[str, int] | Callable[[str], Any] | None = None,
    limits: RunLimits | None = None,
    views_may_copy: bool = False,
) -> list[Any]:
    """Run ``graph`` on ``inputs``; ``on_node(node)`` may return a context manager entered
    around each node's call (the tracer's hook for source locations); ``after_node(node,
    result)`` sees each node's result. Symbolic sizes in arguments (``SymExpr``) take the
    values ``symbols`` gives (a mapping of symbol values, or a function of the expression
    string); by default symbols are bound from the inputs' sizes. ``limits``: stop with a
    RunLimitError after ``limits.max_steps`` nodes. ``views_may_copy``: the graph is functional
    (nothing writes through a view), so a ``view`` its input's layout cannot take is a
    ``reshape``: an input laid out otherwise than when the graph was traced (a saved tensor in the
    layout generated code returned it in) gives the same values."""
    if len(inputs) != len(graph.inputs):
        raise IRError(f"graph {graph.name!r} takes {len(graph.inputs)} inputs, got {len(inputs)}")
    if not callable(symbols):
        values = dict(symbols) if symbols is not None else bind_symbols(graph, inputs)
        symbols = lambda expr: evaluate(expr, values)  # noqa: E731
    env: dict[Value, Any] = dict(zip(graph.inputs, inputs))
    for step, node in enumerate(graph.nodes, 1):
        if limits is not None and step > limits.max_steps:
            raise RunLimitError(f"the run took more than {limits.max_steps} steps (nodes) and was stopped at "
                                f"{node.op}{_where(node)}; raise RunLimits.max_steps to run it")
        fn = resolve_op(node.op)
        args = _materialize(node.args, env, symbols)
        if node.op in ATTENTION_BIAS_POSITIONS:
            args = _with_aligned_attention_bias(node.op, args)
        kwargs = _materialize(node.kwargs, env, symbols)
        ctx = on_node(node) if on_node is not None else None
        try:
            if ctx is not None:
                with ctx:
                    result = fn(*args, **kwargs)
            else:
                result = fn(*args, **kwargs)
        except (IRError, RunLimitError):
            raise
        except RuntimeError as exc:
            if not (views_may_copy and node.op in _VIEWS and "view size is not compatible" in str(exc)):
                raise type(exc)(f"{exc}\n  while running {node!r}{_where(node)}") from exc
            result = torch.ops.aten.reshape.default(*args, **kwargs)
        except Exception as exc:
            where = _where(node)
            raise type(exc)(f"{exc}\n  while running {node!r}{where}") from exc
        _bind_outputs(node, result, env)
        if after_node is not None:
            after_node(node, result)
    return _materialize(list(graph.outputs), env, symbols)


def aligned_attention_bias(bias: torch.Tensor) -> torch.Tensor:
    """``bias`` itself where the memory-efficient and cuDNN attention kernels take its layout, else
    the same values in rows padded to ATTENTION_BIAS_ALIGNMENT elements, as eager's
    scaled_dot_product_attention passes them. A saved mask can reach a backward in the layout
    generated code gave it, which the kernels refuse."""
    steps = [st for sz, st in zip(bias.shape[:-1], bias.stride()[:-1]) if sz != 1]
    if bias.stride(-1) == 1 and all(x % ATTENTION_BIAS_ALIGNMENT == 0 for x in [*steps, bias.storage_offset()]):
        return bias
    columns = bias.shape[-1]
    rows = bias.new_empty((*bias.shape[:-1], columns + -columns % ATTENTION_BIAS_ALIGNMENT))[..., :columns]
    return rows.copy_(bias)


def _with_aligned_attention_bias(op: str, args: Sequence[Any]) -> Sequence[Any]:
    position = ATTENTION_BIAS_POSITIONS[op]
    if position >= len(args) or not isinstance(args[position], torch.Tensor) or args[position].dim() < 2:
        return args
    aligned = list(args)
    aligned[position] = aligned_attention_bias(args[position])
    return aligned


def _bind_outputs(node: Node, result: Any, env: dict[Value, Any]) -> None:
    if len(node.outputs) == 1:
        env[node.outputs[0]] = result
    elif node.outputs:
        if not isinstance(result, (tuple, list)) or len(result) != len(node.outputs):
            raise IRError(f"{node!r} declares {len(node.outputs)} outputs but its op returned {type(result).__name__}")
        for v, r in zip(node.outputs, result):
            env[v] = r


def _where(node: Node) -> str:
    src = node.meta.get("source")
    if not src:
        return ""
    return f"\n  from {src.get('file')}:{src.get('line')}: {src.get('text', '').strip()}"


def run_program(program: Program, *args: Any, limits: RunLimits | None = None) -> tuple:
    """Run the entry graph of ``program`` on real tensors (the default backend's engine),
    bounded by ``limits`` when given (see the module docstring)."""
    if limits is None:
        return tuple(run_graph(program.main, list(args), views_may_copy=True))
    from fireclay_ir.run_limits import allocation_guard, value_bytes

    held = limits.check_tensor((value_bytes(list(args)),), "uint8", "the input data")
    with allocation_guard(lambda: limits.max_bytes - held):
        return tuple(run_graph(program.main, list(args), limits=limits, views_may_copy=True))
