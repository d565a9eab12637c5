"""Batching rules: the torch calls of a vmapped function replayed on batched values (vmap.py).

A :class:`Batched` value is a tensor of the graph being built (the *physical* value) and the
dimension of it that runs over the batch (``bdim``; None when every example sees the same
tensor). Per-example (*logical*) shapes are the physical ones without ``bdim``. Each rule takes
one recorded call of the per-example trace and records, on the physical values, the torch calls
that compute every example's result at once, then says where the result's batch dimension is.

The table :data:`RULES` maps op names (as in ``torch::<name>``) to rules. The families:

- pointwise and broadcasting ops: batched operands get their batch dimension in front and are
  padded with size-1 dims to the operands' highest per-example rank, so that the per-example
  dims still broadcast right-aligned; unbatched operands are left to broadcast as they are.
  A 0-d per-example operand that becomes a 1-d physical one would change type promotion (0-d
  tensors rank below dimensioned ones): such operands are cast to the per-example result type.
- reductions, views and other ops with dimension arguments: the batch dimension goes in front
  and every per-example dim is shifted past it;
- indexing (``t[...]`` and ``aten.index``) with batched index tensors: the batch is indexed
  too, with ``arange(batch)`` as one more index tensor placed where the per-example indices'
  result dims land;
- factories that read only a tensor's dtype and device (``new_ones``): the result is the same
  for every example.

A call none of whose tensors is batched is recorded unchanged. An op without a rule raises
:class:`Unsupported`: the vmapped call becomes a graph break and runs eagerly under torch's own
vmap, so a missing rule never gives a wrong answer.
"""

from __future__ import annotations

import dataclasses
import operator
from collections.abc import Callable, Sequence
from typing import Any, cast

import torch

from fireclay_capture.errors import Unsupported
from fireclay_capture.variables.base import ConstVar, Var, const
from fireclay_capture.variables.containers import BaseListVar, ListVar, TupleVar
from fireclay_capture.variables.tensor import CallRecord, TensorVar, record_call, tensors_in


@dataclasses.dataclass(kw_only=True)
class Batched:
    """A value of the vmapped function as the batched graph holds it."""

    var: TensorVar  # the physical tensor
    bdim: int | None  # its batch dimension; None: the same tensor for every example

    @property
    def logical_ndim(self) -> int:
        return self.var.fake.dim() - (self.bdim is not None)

    @property
    def logical_shape(self) -> tuple:
        shape = tuple(self.var.fake.shape)
        return shape if self.bdim is None else shape[:self.bdim] + shape[self.bdim + 1:]


class Batcher:
    """Replays the call log of one vmapped function's per-example trace on batched values."""

    def __init__(self, tx, size: int, env: dict[int, Batched]):
        self.tx, self.size = tx, size
        self.env = env  # per-example Value (by id) -> its batched form

    # -- values
    def of(self, var: TensorVar) -> Batched:
        """The batched form of a per-example tensor; a tensor from outside the vmapped function
        (a closure, an unmapped argument) is the same for every example."""
        known = self.env.get(id(var.value))
        return known if known is not None else Batched(var=var, bdim=None)

    def bind(self, logical: Var, physical: Var, bdim: int | None) -> None:
        """Remember that the per-example result ``logical`` is ``physical`` with ``bdim``."""
        if isinstance(logical, TensorVar):
            if not isinstance(physical, TensorVar):
                raise Unsupported(f"vmap: a batching rule returned {physical} for a tensor")
            self.env[id(logical.value)] = Batched(var=physical, bdim=bdim)
        elif isinstance(logical, BaseListVar) and isinstance(physical, BaseListVar) \
                and len(logical.items) == len(physical.items):
            for lo, ph in zip(logical.items, physical.items):
                self.bind(lo, ph, bdim)
        elif not isinstance(logical, ConstVar):
            raise Unsupported(f"vmap: a result of the vmapped function's ops that is not a tensor ({logical})")

    def physical(self, v: Var) -> Var:
        """``v`` with every tensor replaced by its physical value (for calls left unbatched)."""
        if isinstance(v, TensorVar):
            return self.of(v).var
        if isinstance(v, BaseListVar):
            items = [self.physical(i) for i in v.items]
            return ListVar(items) if isinstance(v, ListVar) else TupleVar(items)
        return v

    # -- replay
    def replay(self, record: CallRecord) -> None:
        if record.node is None:  # folded to a constant at trace time: nothing to record
            return
        if _draws_random_numbers(record):
            # torch's vmap draws per example or once (its ``randomness``), or refuses: left to it.
            raise Unsupported(f"vmap: {record.name} draws random numbers inside a function given to torch.vmap")
        tensors = tensors_in([*record.args, *record.kwargs.values()])
        if all(self.of(t).bdim is None for t in tensors):
            out = self.call(record.name, record.fn, [self.physical(a) for a in record.args],
                            {k: self.physical(v) for k, v in record.kwargs.items()})
            self.bind(record.result, out, None)
            return
        rule = RULES.get(record.name)
        if rule is None:
            raise Unsupported(f"vmap: no batching rule for {record.name}")
        out, bdim = rule(self, record)
        self.bind(record.result, out, bdim)

    # -- physical calls
    def call(self, name: str, fn: Any, args: list[Var], kwargs: dict[str, Var] | None = None) -> Var:
        return record_call(self.tx, name, fn, args, kwargs or {})

    def method(self, var: TensorVar, name: str, *args: Any, **kwargs: Any) -> TensorVar:
        """``var.<name>(*args, **kwargs)`` recorded, constants given as Python values."""
        out = self.call(f"Tensor.{name}", getattr(torch.Tensor, name), [var, *map(_var, args)],
                        {k: _var(v) for k, v in kwargs.items()})
        assert isinstance(out, TensorVar)
        return out

    def front(self, b: Batched) -> TensorVar:
        """The physical tensor with its batch dimension first (expanded when unbatched)."""
        if b.bdim is None:
            return self.method(b.var, "expand", self.size, *b.var.fake.shape)
        if b.bdim == 0:
            return b.var
        return self.method(b.var, "movedim", b.bdim, 0)

    def padded(self, b: Batched, rank: int) -> TensorVar:
        """A batched value with its batch dim first and size-1 dims after it up to ``rank``
        per-example dims, so that it broadcasts with per-example tensors of that rank."""
        var = self.front(b)
        for _ in range(rank - b.logical_ndim):
            var = self.method(var, "unsqueeze", 1)
        return var

    def cast(self, var: TensorVar, dtype: torch.dtype) -> TensorVar:
        return var if var.fake.dtype == dtype else self.method(var, "to", dtype)


Rule = Callable[[Batcher, CallRecord], tuple[Var, "int | None"]]
RULES: dict[str, Rule] = {}


_RANDOM = frozenset({
    "rand", "randn", "randint", "rand_like", "randn_like", "randint_like", "randperm", "normal", "bernoulli",
    "multinomial", "poisson", "uniform_", "normal_", "bernoulli_", "exponential_", "geometric_", "log_normal_",
    "cauchy_", "random_", "rrelu", "rrelu_", "gumbel_softmax"})
_DROPOUTS = frozenset({"dropout", "dropout1d", "dropout2d", "dropout3d", "alpha_dropout", "feature_alpha_dropout",
                       "feature_dropout"})


def _draws_random_numbers(record: CallRecord) -> bool:
    short = record.name.rsplit(".", 1)[-1]
    if short in _DROPOUTS:  # random only when training (F.dropout's default)
        training = _arg(record, 2, "training", "train")
        return training is None or not training.is_constant() or bool(training.as_python_constant())
    return short in _RANDOM


def _var(value: Any) -> Var:
    return value if isinstance(value, Var) else const(value)


def tensors_only(items: Sequence[Var]) -> list[TensorVar] | None:
    """``items`` when every one of them is a tensor, else None."""
    tensors = [i for i in items if isinstance(i, TensorVar)]
    return tensors if len(tensors) == len(items) else None


def _tensor_arg(record: CallRecord, index: int) -> TensorVar:
    """The argument at ``index`` of a call whose op takes a tensor there (the fake run that
    recorded the call held it to that)."""
    arg = record.args[index]
    if not isinstance(arg, TensorVar):
        raise Unsupported(f"vmap: {record.name} with {arg} where a tensor was expected")
    return arg


def _constant(v: Var | None, what: str) -> Any:
    if v is None:
        return None
    if not v.is_constant():
        raise Unsupported(f"vmap: {what} is not a constant of the trace")
    return v.as_python_constant()


def _register(names: list[str], rule: Rule) -> None:
    for name in names:
        RULES[name] = rule


def _names(*short: str, roots: tuple[str, ...] = ("torch", "Tensor")) -> list[str]:
    """Op names of ``short`` under each root that has them."""
    holders = {"torch": torch, "Tensor": torch.Tensor, "torch.nn.functional": torch.nn.functional,
               "torch.special": torch.special, "operator": operator}
    return [f"{root}.{s}" for root in roots for s in short if hasattr(holders[root], s)]


# --------------------------------------------------------------------------- pointwise


def _pointwise(promoted: Callable[[CallRecord], list[Var]] | None = None, self_shaped: bool = False) -> Rule:
    """A rule for a broadcasting elementwise op. ``promoted`` picks the operands that take part
    in type promotion (default: every operand); ``self_shaped``: the result has ``self``'s shape
    (``masked_fill``), so an unbatched ``self`` is expanded over the batch first."""

    def rule(b: Batcher, record: CallRecord) -> tuple[Var, int | None]:
        tensors = tensors_in([*record.args, *record.kwargs.values()])
        batched = {id(t): b.of(t) for t in tensors}
        rank = max(bt.logical_ndim for bt in batched.values())
        operands = promoted(record) if promoted is not None else [*record.args, *record.kwargs.values()]
        casts = _promotion_casts(batched, operands)
        only = len(tensors) == 1 and not self_shaped

        def convert(v: Var) -> Var:
            if isinstance(v, TensorVar):
                bt = batched[id(v)]
                if only:  # one tensor: its batch dim may stay where it is
                    return bt.var
                if bt.bdim is None and not (self_shaped and v is record.args[0]):
                    return bt.var
                var = b.padded(bt, rank)
                return b.cast(var, casts[id(v)]) if id(v) in casts else var
            if isinstance(v, BaseListVar):
                return TupleVar([convert(i) for i in v.items]) if isinstance(v, TupleVar) \
                    else ListVar([convert(i) for i in v.items])
            return v

        args = [convert(a) for a in record.args]
        kwargs = {k: convert(v) for k, v in record.kwargs.items()}
        out = b.call(record.name, record.fn, args, kwargs)
        return out, (batched[id(tensors[0])].bdim if only else 0)

    return rule


def _promotion_casts(batched: dict[int, Batched], operands: list[Var]) -> dict[int, torch.dtype]:
    """Casts that keep type promotion per-example: a batched 0-d operand becomes 1-d physically,
    and would then outrank the dimensioned operands it ranked below."""
    tensors = [v for v in operands if isinstance(v, TensorVar)]
    zero_d = [t for t in tensors if batched[id(t)].bdim is not None and batched[id(t)].logical_ndim == 0]
    if not zero_d or len(zero_d) == len(tensors) or len({t.fake.dtype for t in tensors}) == 1:
        return {}  # the operands' ranks keep their order, or promotion has one dtype to choose
    if len(operands) != 2:
        raise Unsupported("vmap: type promotion between a batched 0-d tensor and other tensors of "
                          "another dtype, with more than two operands")
    a, c = operands
    dtype = torch.result_type(a.fake if isinstance(a, TensorVar) else a.as_python_constant(),
                              c.fake if isinstance(c, TensorVar) else c.as_python_constant())
    return {id(t): dtype for t in zero_d}


_UNARY = ("abs", "neg", "negative", "positive", "exp", "exp2", "expm1", "log", "log2", "log10", "log1p", "sqrt",
          "rsqrt", "sin", "cos", "tan", "asin", "acos", "atan", "sinh", "cosh", "tanh", "asinh", "acosh", "atanh",
          "sigmoid", "relu", "floor", "ceil", "round", "trunc", "frac", "sign", "sgn", "reciprocal", "erf", "erfc",
          "erfinv", "square", "logical_not", "bitwise_not", "isnan", "isinf", "isfinite", "isneginf", "isposinf",
          "nan_to_num", "signbit", "float", "double", "half", "bfloat16", "int", "long", "bool", "short",
          "contiguous", "clone", "detach")
_BINARY = ("add", "sub", "subtract", "mul", "multiply", "div", "divide", "true_divide", "floor_divide", "remainder",
           "fmod", "pow", "maximum", "minimum", "fmax", "fmin", "eq", "ne", "lt", "le", "gt", "ge", "greater",
           "less", "greater_equal", "less_equal", "not_equal", "logical_and", "logical_or", "logical_xor",
           "bitwise_and", "bitwise_or", "bitwise_xor", "bitwise_left_shift", "bitwise_right_shift", "atan2",
           "hypot", "copysign", "xlogy", "clamp", "clip", "clamp_min", "clamp_max", "lerp", "addcmul", "addcdiv",
           "__and__", "__or__", "__xor__", "__invert__", "__lshift__", "__rshift__", "__radd__", "__rsub__",
           "__rmul__", "__rtruediv__", "__rpow__", "__truediv__", "__floordiv__", "__mod__", "__pow__")
_OPERATORS = ("add", "sub", "mul", "truediv", "floordiv", "mod", "pow", "and_", "or_", "xor", "lshift", "rshift",
              "eq", "ne", "lt", "le", "gt", "ge", "neg", "pos", "invert", "abs")
_ACTIVATIONS = ("gelu", "silu", "mish", "elu", "leaky_relu", "hardtanh", "relu6", "hardsigmoid", "hardswish",
                "selu", "celu", "softsign", "tanhshrink", "logsigmoid", "softplus", "relu", "sigmoid", "tanh")

_register(_names(*_UNARY, *_BINARY) + _names(*_OPERATORS, roots=("operator",))
          + _names(*_ACTIVATIONS, roots=("torch.nn.functional",))
          + _names("expit", "logit", "erf", "erfc", "exp2", "expm1", "log1p", roots=("torch.special",)),
          _pointwise())
_register(_names(*_DROPOUTS, roots=("torch", "torch.nn.functional")), _pointwise())  # not training: the identity
_register(_names("where"), _pointwise(promoted=lambda r: list(r.args[1:3])))
_register(_names("masked_fill"), _pointwise(promoted=lambda r: [], self_shaped=True))


def _type_as(b: Batcher, record: CallRecord) -> tuple[Var, int | None]:
    """``a.type_as(t)`` reads only ``t``'s dtype."""
    me = b.of(_tensor_arg(record, 0))
    return b.cast(me.var, _tensor_arg(record, 1).fake.dtype), me.bdim


_register(["Tensor.type_as"], _type_as)


def _to(b: Batcher, record: CallRecord) -> tuple[Var, int | None]:
    """``t.to(...)``: a tensor argument gives only its dtype and device."""
    me = b.of(_tensor_arg(record, 0))
    args = [me.var, *(b.of(a).var if isinstance(a, TensorVar) else a for a in record.args[1:])]
    return b.call(record.name, record.fn, args, dict(record.kwargs)), me.bdim


_register(["Tensor.to"], _to)


def _like(b: Batcher, record: CallRecord) -> tuple[Var, int | None]:
    """``torch.zeros_like(t)`` and kin: the physical tensor's shape, the batch dim where it was."""
    me = b.of(_tensor_arg(record, 0))
    out = b.call(record.name, record.fn, [me.var, *record.args[1:]], dict(record.kwargs))
    return out, me.bdim


_register(_names("zeros_like", "ones_like", "empty_like", "full_like", roots=("torch",)), _like)


def _new_factory(b: Batcher, record: CallRecord) -> tuple[Var, int | None]:
    """``t.new_ones(size)`` and kin read only ``t``'s dtype and device: one tensor for all."""
    me = b.of(_tensor_arg(record, 0))
    if tensors_in([*record.args[1:], *record.kwargs.values()]):
        raise Unsupported(f"vmap: {record.name} with tensor arguments")
    return b.call(record.name, record.fn, [me.var, *record.args[1:]], dict(record.kwargs)), None


_register(_names("new_ones", "new_zeros", "new_empty", "new_full", roots=("Tensor",)), _new_factory)


# --------------------------------------------------------------------------- dims


def _arg(record: CallRecord, index: int, *names: str) -> Var | None:
    """The argument at ``index`` (``self`` is 0) or given by one of ``names``."""
    if index < len(record.args):
        return record.args[index]
    for n in names:
        if n in record.kwargs:
            return record.kwargs[n]
    return None


def _dim(d: int, ndim: int) -> int:
    """A per-example dim, normalised, as a physical dim with the batch dim first."""
    if not -max(ndim, 1) <= d < max(ndim, 1):
        raise Unsupported(f"vmap: dim {d} out of range for a {ndim}-d tensor")
    return d % max(ndim, 1) + 1


_REDUCTIONS = ("sum", "mean", "amax", "amin", "prod", "any", "all", "max", "min", "argmax", "argmin",
               "logsumexp", "nansum", "nanmean", "count_nonzero")


def _reduction(b: Batcher, record: CallRecord) -> tuple[Var, int | None]:
    me = b.of(_tensor_arg(record, 0))
    x, n = b.front(me), me.logical_ndim
    dim = _arg(record, 1, "dim", "axis")
    if isinstance(dim, TensorVar):  # torch.max(a, b): elementwise
        return _pointwise()(b, record)
    dims = _constant(dim, "a reduction's dim")
    if isinstance(dims, (bool, torch.dtype)):
        raise Unsupported(f"vmap: {record.name} with a positional {type(dims).__name__}")
    keep = _constant(_arg(record, 2, "keepdim"), "keepdim")
    rest = {k: v for k, v in record.kwargs.items() if k not in ("dim", "axis", "keepdim")}
    if len(record.args) > 3:
        raise Unsupported(f"vmap: {record.name} with more positional arguments")
    if n == 0 and dims is not None:
        raise Unsupported(f"vmap: {record.name} over a dim of a 0-d tensor")
    if dims is None or dims == [] or dims == ():
        if keep:
            raise Unsupported(f"vmap: {record.name} over every dim with keepdim")
        flat = b.method(x, "reshape", b.size, -1)
        name, fn = record.name, record.fn
        if name.split(".")[-1] in ("max", "min"):  # over every dim: a tensor, not (values, indices)
            name = f"torch.a{name.split('.')[-1]}"
            fn = getattr(torch, name.split(".")[-1])
        return b.call(name, fn, [flat, const(1)], rest), 0
    shifted = tuple(_dim(d, n) for d in dims) if isinstance(dims, (list, tuple)) else _dim(dims, n)
    kwargs = dict(rest, keepdim=const(bool(keep))) if keep is not None else rest
    return b.call(record.name, record.fn, [x, const(shifted)], kwargs), 0


_register(_names(*_REDUCTIONS), _reduction)


def _dim_op(*positions: int, new_dims: int = 0) -> Rule:
    """Ops whose arguments at ``positions`` are dims of ``self`` (ints or lists of ints); the
    result's batch dim stays first. ``new_dims``: dims the op adds (``unsqueeze``: 1)."""

    def rule(b: Batcher, record: CallRecord) -> tuple[Var, int | None]:
        me = b.of(_tensor_arg(record, 0))
        n = me.logical_ndim + new_dims
        args: list[Var] = [b.front(me)]
        for i, a in enumerate(record.args[1:], start=1):
            if i in positions:
                d = _constant(a, f"{record.name}'s dim")
                if d is None:
                    raise Unsupported(f"vmap: {record.name} without a dim")
                a = const(type(d)(_dim(x, n) for x in d) if isinstance(d, (list, tuple)) else _dim(d, n))
            elif isinstance(a, TensorVar):
                raise Unsupported(f"vmap: {record.name} with a tensor argument")
            args.append(a)
        kwargs = dict(record.kwargs)
        for name in ("dim", "dims", "dim0", "dim1", "source", "destination"):
            if name in kwargs:
                d = _constant(kwargs[name], f"{record.name}'s {name}")
                if d is None:
                    raise Unsupported(f"vmap: {record.name} without a dim")
                kwargs[name] = const(type(d)(_dim(x, n) for x in d) if isinstance(d, (list, tuple)) else _dim(d, n))
        if me.logical_ndim == 0 and record.name.split(".")[-1] in ("select", "narrow"):
            raise Unsupported(f"vmap: {record.name} of a 0-d tensor")
        return b.call(record.name, record.fn, args, kwargs), 0

    return rule


_register(_names("unsqueeze"), _dim_op(1, new_dims=1))
_register(_names("transpose", "swapaxes", "swapdims", "movedim", "moveaxis"), _dim_op(1, 2))


def _flatten(b: Batcher, record: CallRecord) -> tuple[Var, int | None]:
    me = b.of(_tensor_arg(record, 0))
    if me.logical_ndim == 0 or len(record.args) > 3:
        raise Unsupported(f"vmap: {record.name} of a 0-d tensor or with other arguments")
    start = _constant(_arg(record, 1, "start_dim"), "flatten's start_dim")
    end = _constant(_arg(record, 2, "end_dim"), "flatten's end_dim")
    n = me.logical_ndim
    return b.method(b.front(me), "flatten", _dim(0 if start is None else start, n),
                    _dim(-1 if end is None else end, n)), 0


_register(_names("flatten"), _flatten)
_register(_names("select", "narrow", "softmax", "log_softmax", "cumsum", "cumprod", "logcumsumexp", "flip"),
          _dim_op(1))
_register(_names("softmax", "log_softmax", roots=("torch.nn.functional",)), _dim_op(1))


def _squeeze(b: Batcher, record: CallRecord) -> tuple[Var, int | None]:
    me = b.of(_tensor_arg(record, 0))
    dim = _constant(_arg(record, 1, "dim"), "squeeze's dim")
    n = me.logical_ndim
    if dim is None:
        dims = tuple(i + 1 for i, s in enumerate(me.logical_shape) if s == 1)
    else:
        dims = tuple(_dim(d, n) for d in dim) if isinstance(dim, (list, tuple)) else (_dim(dim, n),)
    x = b.front(me)
    return (b.method(x, "squeeze", dims) if dims else x), 0


_register(_names("squeeze"), _squeeze)


def _permute(b: Batcher, record: CallRecord) -> tuple[Var, int | None]:
    me = b.of(_tensor_arg(record, 0))
    dims = [_constant(a, "permute's dims") for a in record.args[1:]] or [_constant(record.kwargs.get("dims"), "dims")]
    if len(dims) == 1 and isinstance(dims[0], (list, tuple)):
        dims = list(dims[0])
    return b.method(b.front(me), "permute", [0, *(_dim(d, me.logical_ndim) for d in dims)]), 0


_register(_names("permute"), _permute)


def _transposed(b: Batcher, record: CallRecord) -> tuple[Var, int | None]:
    """``t.T`` / ``t.t()`` (every dim reversed; ``t()`` only up to 2-d) and ``t.mT`` (the last two)."""
    me = b.of(_tensor_arg(record, 0))
    n, x = me.logical_ndim, b.front(me)
    if record.name == "Tensor.mT":
        return (b.method(x, "transpose", -2, -1) if n >= 2 else x), 0
    if len(record.args) > 1 or (record.name != "Tensor.T" and n > 2):
        raise Unsupported(f"vmap: {record.name} with these arguments")
    return (b.method(x, "permute", [0, *range(n, 0, -1)]) if n >= 2 else x), 0


_register(["Tensor.T", "Tensor.mT", "Tensor.t", "torch.t"], _transposed)


def _shape_of(record: CallRecord, what: str) -> list:
    shape = [_constant(a, what) for a in record.args[1:]]
    if not shape and "size" in record.kwargs:
        shape = [_constant(record.kwargs["size"], what)]
    if not shape and "shape" in record.kwargs:
        shape = [_constant(record.kwargs["shape"], what)]
    if len(shape) == 1 and isinstance(shape[0], (list, tuple, torch.Size)):
        shape = list(shape[0])
    if not all(isinstance(s, (int, torch.SymInt)) and not isinstance(s, bool) for s in shape):
        raise Unsupported(f"vmap: {what} other than a shape")
    return shape


def _reshape(b: Batcher, record: CallRecord) -> tuple[Var, int | None]:
    """``view`` and ``reshape`` (as reshape: the batch dim moved first may not be viewable)."""
    me = b.of(_tensor_arg(record, 0))
    shape = _shape_of(record, f"{record.name}'s shape")
    return b.method(b.front(me), "reshape", b.size, *shape), 0


_register(_names("view", "reshape"), _reshape)


def _expand(b: Batcher, record: CallRecord) -> tuple[Var, int | None]:
    me = b.of(_tensor_arg(record, 0))
    if record.name.endswith("expand_as"):
        if not isinstance(record.args[1], TensorVar):
            raise Unsupported("vmap: expand_as something other than a tensor")
        shape = list(b.of(record.args[1]).logical_shape)
        if me.bdim is None:  # only the shape of the other is read: the same for every example
            return b.method(me.var, "expand", *shape), None
    else:
        shape = _shape_of(record, "expand's sizes")
    return b.method(b.padded(me, len(shape)), "expand", b.size, *shape), 0


_register(_names("expand", "expand_as"), _expand)


def _concat(b: Batcher, record: CallRecord) -> tuple[Var, int | None]:
    """``torch.cat`` / ``torch.stack``: unbatched pieces expanded over the batch."""
    pieces = record.args[0]
    tensors = tensors_only(pieces.items) if isinstance(pieces, BaseListVar) else None
    if tensors is None:
        raise Unsupported(f"vmap: {record.name} of something other than a list of tensors")
    parts = [b.of(p) for p in tensors]
    n = parts[0].logical_ndim + (1 if record.name.endswith("stack") else 0)
    dim = _constant(_arg(record, 1, "dim", "axis"), f"{record.name}'s dim")
    physical = ListVar([b.front(p) for p in parts])
    return b.call(record.name, record.fn, [physical, const(_dim(0 if dim is None else dim, n))]), 0


_register(_names("cat", "concat", "concatenate", "stack", roots=("torch",)), _concat)


def _matmul(b: Batcher, record: CallRecord) -> tuple[Var, int | None]:
    """``a @ c``: per-example vectors made matrices and batched operands padded so that the batch
    dim is a leading batch dim of matmul on both sides; the result reshaped to the examples'."""
    operands = tensors_only(record.args)
    if len(record.args) != 2 or record.kwargs or operands is None:
        raise Unsupported(f"vmap: {record.name} with other arguments")
    a, c = (b.of(v) for v in operands)
    if a.logical_ndim == 0 or c.logical_ndim == 0:
        raise Unsupported("vmap: matmul of a 0-d tensor")
    left = a.var if a.bdim is None else b.front(a)
    right = c.var if c.bdim is None else b.front(c)
    left_rank, right_rank = a.logical_ndim, c.logical_ndim
    if left_rank == 1:
        left, left_rank = b.method(left, "unsqueeze", -2), 2
    if right_rank == 1:
        right, right_rank = b.method(right, "unsqueeze", -1), 2
    rank = max(left_rank, right_rank)
    for _ in range(rank - left_rank if a.bdim is not None else 0):
        left = b.method(left, "unsqueeze", 1)
    for _ in range(rank - right_rank if c.bdim is not None else 0):
        right = b.method(right, "unsqueeze", 1)
    out = b.call("torch.matmul", torch.matmul, [left, right])
    assert isinstance(out, TensorVar) and isinstance(record.result, TensorVar)
    return b.method(out, "reshape", b.size, *record.result.fake.shape), 0


_register(["torch.matmul", "Tensor.matmul", "operator.matmul"], _matmul)


# --------------------------------------------------------------------------- indexing


def _batch_index(b: Batcher, rank: int, device: str) -> TensorVar:
    """``arange(batch)`` shaped to index the batch dim beside index tensors of ``rank`` dims."""
    arange = b.call("torch.arange", torch.arange, [const(b.size)], {"device": const(torch.device(device))})
    assert isinstance(arange, TensorVar)
    return b.method(arange, "reshape", b.size, *([1] * rank)) if rank else arange


def _index_tensors(b: Batcher, tensors: list[TensorVar]) -> tuple[list[TensorVar], int, bool]:
    """Physical index tensors: batched ones with the batch first, padded to the indices' common
    per-example rank; also that rank, and whether any index is batched."""
    parts = [b.of(t) for t in tensors]
    for t in tensors:
        if t.fake.dtype in (torch.bool, torch.uint8):
            raise Unsupported("vmap: indexing with a mask")
    rank = max((p.logical_ndim for p in parts), default=0)
    any_batched = any(p.bdim is not None for p in parts)
    return [b.padded(p, rank) if p.bdim is not None else p.var for p in parts], rank, any_batched


def _aten_index(b: Batcher, record: CallRecord) -> tuple[Var, int | None]:
    """``aten.index(x, [i, j, ...])`` with every index a tensor: the indices' result dims come
    first, so the batch (an index too, when ``x`` is batched) stays in front."""
    me = b.of(_tensor_arg(record, 0))
    indices = record.args[1]
    tensors = tensors_only(indices.items) if isinstance(indices, BaseListVar) else None
    if tensors is None:
        raise Unsupported("vmap: aten.index with an index that is not a tensor")
    physical, rank, _ = _index_tensors(b, tensors)
    if me.bdim is not None:
        physical = [_batch_index(b, rank, me.var.device), *physical]
        x = b.front(me)
    else:
        x = me.var
    return b.call(record.name, record.fn, [x, ListVar(physical)]), 0


_register(["torch.ops.aten.index.Tensor"], _aten_index)


def _int_list(v: Var) -> list[int] | None:
    """The ints of ``v`` when it is a list of int constants, not empty (in an index: an index
    tensor), else None."""
    if not isinstance(v, ListVar) or not v.items:
        return None
    ints = [i.value for i in v.items if isinstance(i, ConstVar) and type(i.value) is int]
    return ints if len(ints) == len(v.items) else None


def _getitem(b: Batcher, record: CallRecord) -> tuple[Var, int | None]:
    """``x[key]``: basic indexing shifts past the batch dim; index tensors follow torch's rule
    (the dims of adjacent index tensors land where the first of them stood, otherwise first)."""
    me = b.of(_tensor_arg(record, 0))
    key = record.args[1]
    if isinstance(key, ConstVar) and isinstance(key.value, tuple):
        entries: list[Var] = [const(v) for v in key.value]
    else:
        entries = list(key.items) if isinstance(key, TupleVar) else [key]
    kinds = []
    for n, e in enumerate(entries):
        ints = _int_list(e)
        if ints is not None:  # a list of ints is an index tensor
            e = entries[n] = b.call("torch.tensor", torch.tensor, [const(ints)],
                                    {"dtype": const(torch.int64), "device": const(torch.device(me.var.device))})
        if isinstance(e, TensorVar):
            kinds.append("tensor")
        elif isinstance(e, ConstVar) and e.value is None:
            kinds.append("none")
        elif isinstance(e, ConstVar) and e.value is Ellipsis:
            kinds.append("ellipsis")
        elif isinstance(e, ConstVar) and isinstance(e.value, slice):
            kinds.append("slice")
        elif isinstance(e, ConstVar) and isinstance(e.value, int) and not isinstance(e.value, bool):
            kinds.append("int")
        else:
            raise Unsupported(f"vmap: indexing with {e}")
    if kinds.count("ellipsis") > 1:
        raise Unsupported("vmap: indexing with two ellipses")
    if "ellipsis" in kinds:  # spelled out as full slices, so that positions count dims
        at = kinds.index("ellipsis")
        used = sum(k in ("tensor", "slice", "int") for k in kinds)
        fill = me.logical_ndim - used
        entries[at:at + 1] = [const(slice(None))] * fill
        kinds[at:at + 1] = ["slice"] * fill
    if "tensor" in kinds and "int" in kinds:
        # torch applies int indices as selects before the index tensors (they do not count
        # in the index tensors' adjacency): so does the batched form.
        positions, at = [], 0
        for k in kinds:
            positions.append(at)
            at += k != "none"
        x = me.var if me.bdim is None else b.front(me)
        shift = 0 if me.bdim is None else 1
        for i in reversed(range(len(kinds))):
            if kinds[i] == "int":
                x = b.method(x, "select", positions[i] + shift, cast(ConstVar, entries[i]).value)
        me = Batched(var=x, bdim=None if me.bdim is None else 0)
        entries = [e for e, k in zip(entries, kinds) if k != "int"]
        kinds = [k for k in kinds if k != "int"]
    where = [i for i, k in enumerate(kinds) if k == "tensor"]
    if not where:  # basic indexing: the batch dim stays first
        return b.call("operator.getitem", operator.getitem,
                      [b.front(me), TupleVar([const(slice(None)), *entries])]), 0
    adjacent = where == list(range(where[0], where[-1] + 1))
    if not adjacent and "none" in kinds:
        raise Unsupported("vmap: indexing with None beside index tensors that are not adjacent")
    # (the entries at ``where``, in order: those of kind "tensor")
    physical, rank, any_batched = _index_tensors(b, [e for e in entries if isinstance(e, TensorVar)])
    new_entries = list(entries)
    for i, p in zip(where, physical):
        new_entries[i] = p
    before = sum(k in ("slice", "none") for k in kinds[:where[0]])  # result dims before the indices'
    if not any_batched:  # only x is batched: a full slice over the batch
        x = b.front(me)
        out = b.call("operator.getitem", operator.getitem, [x, TupleVar([const(slice(None)), *new_entries])])
        return out, (0 if adjacent else rank)
    if me.bdim is None:
        out = b.call("operator.getitem", operator.getitem, [me.var, TupleVar(new_entries)])
        return out, (before if adjacent else 0)
    batch = _batch_index(b, rank, me.var.device)
    if adjacent:
        at = sum(k == "slice" for k in kinds[:where[0]])  # x's dims the entries before consume
        x = b.front(me)
        if at:
            x = b.method(x, "movedim", 0, at)
        new_entries.insert(where[0], batch)
        out = b.call("operator.getitem", operator.getitem, [x, TupleVar(new_entries)])
        return out, before
    out = b.call("operator.getitem", operator.getitem, [b.front(me), TupleVar([batch, *new_entries])])
    return out, 0


_register(["operator.getitem", "Tensor.__getitem__"], _getitem)
