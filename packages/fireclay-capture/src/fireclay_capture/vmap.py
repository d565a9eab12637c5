"""``torch.vmap`` / ``torch.func.vmap`` called in captured code, captured into the graph.

``torch.vmap(f, in_dims, out_dims)(*args)`` runs ``f`` on every example of a batch at once. The
capture does it in two steps, with nothing of vmap left in the graph:

1. ``f`` is traced once on *per-example* values: each mapped tensor argument is given without
   its mapped dimension (an example of the batch), as a graph input of a scratch graph. The
   trace records ``f``'s torch calls there, and keeps them in a call log (``tx.call_log``).
   Tensors ``f`` reads from elsewhere (closures, unmapped arguments) are the same for every
   example.
2. The call log is replayed on the batched values, each call through the batching rule of its
   op (``batching.py``): what gets recorded in the caller's graph are ordinary torch ops on the
   batched tensors. Calls that touch no batched tensor are recorded unchanged.

Nested vmaps compose: the inner vmap's replay records its ops in the outer one's scratch graph
(and call log), which the outer replay batches in turn.

Anything the per-example trace cannot follow, an op without a batching rule, a side effect
inside ``f`` or a result that is not tensors makes the call of the vmapped function a graph
break (``Unsupported``): it then runs eagerly under torch's vmap, never with a wrong answer.
"""

from __future__ import annotations

import logging
import types
from collections.abc import Callable
from typing import Any

import torch

from fireclay_capture.batching import Batched, Batcher, tensors_only
from fireclay_capture.errors import ObservedException, Unsupported
from fireclay_capture.variables.base import Var
from fireclay_capture.variables.containers import BaseListVar, ListVar, TupleVar
from fireclay_capture.variables.tensor import CallRecord, TensorVar, meta_of
from fireclay_ir import Graph
from fireclay_ir.stages import warn_fallback

log = logging.getLogger("fireclay_capture")

_VMAP_PARAMETERS = ("func", "in_dims", "out_dims", "randomness")
_INSIDE = "in a function given to torch.vmap"


def is_vmap(value: Any) -> bool:
    """Whether ``value`` is torch's vmap (``torch.vmap`` is ``torch.func.vmap``)."""
    try:
        return value is torch.vmap or value is getattr(torch.func, "vmap", None)
    except TypeError:
        return False


def made_by_vmap(value: Any) -> dict[str, Any] | None:
    """The arguments of ``torch.vmap`` that made ``value``, when ``value`` is a function it
    returned (made before the capture: a module-level ``@torch.vmap``), else None."""
    if not isinstance(value, types.FunctionType):
        return None
    code = value.__code__
    if code.co_qualname != "vmap.<locals>.wrapped" \
            or not code.co_filename.endswith(("_functorch/apis.py", "_functorch\\apis.py")):
        return None
    cells = dict(zip(code.co_freevars, value.__closure__ or ()))
    if set(cells) != {"func", "in_dims", "out_dims", "randomness", "chunk_size"}:
        return None
    return {name: cell.cell_contents for name, cell in cells.items()}


class VmapVar(Var):
    """``torch.vmap`` itself: calling it makes the vmapped function."""

    def __init__(self, fn: Any, source=None):
        self.fn, self.source = fn, source

    def python_type(self):
        return type(self.fn)

    def identity(self):
        return self.fn

    def call(self, tx, args, kwargs):
        if len(args) > len(_VMAP_PARAMETERS):
            raise Unsupported("torch.vmap called with too many arguments")
        bound = dict(zip(_VMAP_PARAMETERS, args))
        for name, value in kwargs.items():
            if name in bound or name not in (*_VMAP_PARAMETERS, "chunk_size"):
                raise Unsupported(f"torch.vmap called with argument {name!r}")
            bound[name] = value
        if "func" not in bound:
            raise Unsupported("torch.vmap called without a function")
        in_dims = _constant(bound.get("in_dims"), 0, "in_dims")
        out_dims = _constant(bound.get("out_dims"), 0, "out_dims")
        randomness = _constant(bound.get("randomness"), "error", "randomness")
        chunk_size = _constant(bound.get("chunk_size"), None, "chunk_size")
        if randomness not in ("error", "different", "same") or not (
                chunk_size is None or isinstance(chunk_size, int) and chunk_size > 0):
            raise Unsupported("torch.vmap with an invalid randomness or chunk_size")
        # randomness matters only to random ops, which have no batching rule; chunks change only
        # how eager vmap splits the work, not the values.
        return VmappedVar(bound["func"], in_dims, out_dims, randomness=randomness, chunk_size=chunk_size)

    def __repr__(self):
        return "torch.vmap"

    def reconstruct(self, specs):
        return specs.output(self) if self.source is not None else ("const", self.fn)


class VmappedVar(Var):
    """What ``torch.vmap(func, in_dims, out_dims)`` returned, made in the trace."""

    def __init__(self, func: Var, in_dims: Any, out_dims: Any, *, randomness: str = "error",
                 chunk_size: int | None = None):
        self.func, self.in_dims, self.out_dims = func, in_dims, out_dims
        self.randomness, self.chunk_size = randomness, chunk_size

    def call(self, tx, args, kwargs):
        return call_vmapped(tx, self.func, self.in_dims, self.out_dims, list(args), dict(kwargs))

    def __repr__(self):
        return f"vmap({self.func}, in_dims={self.in_dims}, out_dims={self.out_dims})"

    def reconstruct(self, specs):
        # Across a graph break (the vmapped call itself breaks): torch's vmap, made for real.
        return ("object", VmappedFunction, [
            ("func", specs.spec_of(self.func)), ("in_dims", ("const", self.in_dims)),
            ("out_dims", ("const", self.out_dims)), ("randomness", ("const", self.randomness)),
            ("chunk_size", ("const", self.chunk_size))])


class VmappedFunction:
    """A vmapped function that a graph break hands to Python: calls run under torch's vmap."""

    func: Any
    in_dims: Any
    out_dims: Any
    randomness: str
    chunk_size: int | None

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return torch.vmap(self.func, self.in_dims, self.out_dims, self.randomness,
                          chunk_size=self.chunk_size)(*args, **kwargs)


def _constant(v: Var | None, default: Any, what: str) -> Any:
    if v is None:
        return default
    if not v.is_constant():
        raise Unsupported(f"torch.vmap's {what} is not a constant")
    return v.as_python_constant()


def call_vmapped(tx, func: Var, in_dims: Any, out_dims: Any, args: list[Var], kwargs: dict[str, Var]) -> Var:
    """Record ``vmap(func, in_dims, out_dims)(*args, **kwargs)`` in the graph (module docstring)."""
    if isinstance(in_dims, (tuple, list)):
        if len(in_dims) != len(args):
            raise Unsupported(f"torch.vmap: in_dims has {len(in_dims)} entries for {len(args)} arguments")
        dims = list(in_dims)
    elif in_dims is None or isinstance(in_dims, int):
        dims = [in_dims] * len(args)
    else:
        raise Unsupported(f"torch.vmap: in_dims {in_dims!r}")
    body = Graph("vmap_body")
    env: dict[int, Batched] = {}
    sizes: list[Any] = []  # ints, or symbolic sizes (dynamic shapes)

    def example(t: TensorVar, d: int) -> TensorVar:
        """One example of the mapped tensor ``t``: a graph input of the scratch graph."""
        size = t.fake.shape[d]
        if isinstance(size, int) and size == 0:
            raise Unsupported("torch.vmap over a dim of size 0")
        sizes.append(size)
        fake = _example_fake(tx, t.fake, d)
        value = body.add_input(f"example{len(env)}", meta_of(fake, t.device))
        env[id(value)] = Batched(var=t, bdim=d)
        return TensorVar(value, fake, t.device)

    example_args = [_with_examples(arg, dim, example) for arg, dim in zip(args, dims)]
    if not env:
        raise Unsupported("torch.vmap: no tensor argument is mapped")
    size = sizes[0]
    if any(s is not size and _differ(s, size) for s in sizes[1:]):
        raise Unsupported("torch.vmap: mapped dims of different sizes")

    calls: list[CallRecord] = []
    outer_graph, outer_log = tx.graph, tx.call_log
    effects_before, n_subgraphs = tx.side_effects.version, len(tx.subgraphs)
    try:
        tx.graph, tx.call_log = body, calls
        try:
            result = func.call(tx, example_args, kwargs)
        except ObservedException:
            raise  # an exception of the user's function: eager vmap raises it too
        except Unsupported as e:
            # A new error, so that the graph break lands on the call of the vmapped function.
            inner = e.reason if e.reason.startswith(_INSIDE) else f"{_INSIDE}: {e.reason}"
            raise Unsupported(inner) from None
        finally:
            tx.graph, tx.call_log = outer_graph, outer_log
        if tx.side_effects.version != effects_before:
            raise Unsupported("a function given to torch.vmap changes objects outside it")
        logged = {id(r.node) for r in calls if r.node is not None}
        for node in body.nodes:
            if id(node) not in logged:
                raise Unsupported(f"vmap: no batching rule for {node.op} in a function given to torch.vmap")
        return _replay(tx, calls, Batcher(tx, size, env), result, out_dims)
    except Unsupported as e:
        del tx.subgraphs[n_subgraphs:]  # branches of a cond inside: dropped with the scratch graph
        if not isinstance(e, ObservedException):
            _warn(tx, e)
        raise
    finally:
        for node in reversed(body.nodes):  # the scratch graph is dropped; unlink it from the caller's values
            body.erase(node)


def _warn(tx, e: Unsupported) -> None:
    """Never silent: a vmapped call that stays eager says why, once per place in the user's code."""
    loc = tx.location()
    place = f"{loc['file']}:{loc['line']}" if loc else "torch.vmap"
    warn_fallback(log, place, "vmap", f"torch.vmap at {place} runs eagerly (a graph break): {e.reason}")


def _replay(tx, calls: list[CallRecord], batcher: Batcher, result: Var, out_dims: Any) -> Var:
    graph = tx.graph
    n_nodes = len(graph.nodes)
    try:
        for record in calls:
            batcher.replay(record)
        return _outputs(batcher, result, out_dims)
    except Unsupported:
        for node in reversed(graph.nodes[n_nodes:]):  # what the replay recorded before it failed
            graph.erase(node)
        raise


def _with_examples(arg: Var, dim: Any, example: Callable[[TensorVar, int], TensorVar]) -> Var:
    """``arg`` with each tensor that ``dim`` (its in_dims entry) maps replaced by an example."""
    if dim is None:
        return arg
    if isinstance(arg, TensorVar):
        if not isinstance(dim, int) or isinstance(dim, bool):
            raise Unsupported(f"torch.vmap: in_dim {dim!r} for a tensor")
        ndim = arg.fake.dim()
        if not -ndim <= dim < ndim:
            raise Unsupported(f"torch.vmap: in_dim {dim} for a {ndim}-d tensor")
        return example(arg, dim % ndim)
    if isinstance(arg, BaseListVar):
        if isinstance(dim, (tuple, list)):
            if len(dim) != len(arg.items):
                raise Unsupported("torch.vmap: in_dims does not match the structure of an argument")
            items = [_with_examples(item, d, example) for item, d in zip(arg.items, dim)]
        else:
            items = [_with_examples(item, dim, example) for item in arg.items]
        return ListVar(items) if isinstance(arg, ListVar) else TupleVar(items)
    raise Unsupported(f"torch.vmap: in_dim {dim!r} for {arg}, which is not a tensor")


def _differ(a: Any, b: Any) -> bool:
    """Whether two sizes differ; symbolic sizes compare as their expressions (a guess guarded by
    the shape environment would be a guard the trace does not need)."""
    if isinstance(a, int) and isinstance(b, int):
        return a != b
    return str(a) != str(b)


def _example_fake(tx, fake: torch.Tensor, dim: int) -> torch.Tensor:
    """One example of a mapped tensor: its fake without the mapped dim."""
    if tx.shapes is not None:
        with tx.shapes.mode:
            return fake.select(dim, 0)
    return fake.select(dim, 0)


def _outputs(b: Batcher, result: Var, out_dims: Any) -> Var:
    """The batched results, each with its batch dim at its out_dim."""
    if isinstance(result, TensorVar):
        outs, sequence = [result], None
    elif isinstance(result, BaseListVar) and (tensors := tensors_only(result.items)) is not None:
        outs, sequence = tensors, type(result)
    else:
        raise Unsupported(f"a function given to torch.vmap returns {result}, not tensors")
    if isinstance(out_dims, (tuple, list)):
        if len(out_dims) != len(outs):
            raise Unsupported("torch.vmap: out_dims does not match the results")
        dims = list(out_dims)
    else:
        dims = [out_dims] * len(outs)
    physical: list[Var] = []
    for out, dim in zip(outs, dims):
        bt = b.of(out)
        if dim is None:
            if bt.bdim is not None:
                raise Unsupported("torch.vmap: out_dims None for a result that depends on the batch")
            physical.append(bt.var)
            continue
        if not isinstance(dim, int) or isinstance(dim, bool):
            raise Unsupported(f"torch.vmap: out_dim {dim!r}")
        ndim = bt.logical_ndim + 1
        if not -ndim <= dim < ndim:
            raise Unsupported(f"torch.vmap: out_dim {dim} for a {ndim}-d result")
        dim %= ndim
        if bt.bdim is None:  # the same for every example: expanded over the batch, as vmap does
            shape = list(bt.var.fake.shape)
            shape.insert(dim, b.size)
            physical.append(b.method(b.method(bt.var, "unsqueeze", dim), "expand", *shape))
        elif bt.bdim != dim:
            physical.append(b.method(bt.var, "movedim", bt.bdim, dim))
        else:
            physical.append(bt.var)
    if sequence is None:
        return physical[0]
    return ListVar(physical) if sequence is ListVar else TupleVar(physical)
