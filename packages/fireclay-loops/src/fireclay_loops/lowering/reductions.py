"""Reduction lowerings: sum/mean/prod, max/min and arg-variants, any/all, var/std through
Welford, and the normalisations built from a reduction plus pointwise ops (softmax,
log_softmax, logsumexp, layer norm)."""

from __future__ import annotations

from typing import Any

from fireclay_loops import dtypes, exprs
from fireclay_loops.lowering.registry import register_lowering
from fireclay_loops.lowering.values import TensorValue, load_broadcast
from fireclay_loops.ops import ops


def _dims(x: TensorValue, dim: Any) -> list[int]:
    if dim is None or (isinstance(dim, (list, tuple)) and len(dim) == 0):
        return list(range(x.rank))
    if isinstance(dim, int):
        dim = [dim]
    return sorted({d % x.rank for d in dim}) if x.rank else []


def _reduce(ctx, x: TensorValue, dims: list[int], keepdim: bool, reduction_type: str,
            final=lambda acc, n: acc, acc_dtype: str | None = None, out: int = 0):
    _, dtype, device = ctx.out_meta(out)
    acc_dtype = acc_dtype or dtypes.compute_dtype(dtype)
    src = acc_dtype if reduction_type not in ("argmax", "argmin") else dtypes.compute_dtype(x.dtype)
    [result] = ctx.reduction(x.size, dims, keepdim, device, reduction_type, acc_dtype,
                             lambda idx: ops.to_dtype(x.load(idx), src), [(dtype, final)], src_dtype=src)
    return result


def sum_over(ctx, x: TensorValue, dims: list[int], out: int = 0):
    """The sum of ``x`` over ``dims``, as the current node's result ``out`` (another op's lowering
    computing a sum as part of its work: a bias gradient)."""
    return _reduce(ctx, x, dims, False, "sum", out=out)


@register_lowering("sum.default")
def lower_sum(ctx, x, dtype=None):
    return _reduce(ctx, x, _dims(x, None), False, "sum")


@register_lowering("sum.dim_IntList")
def lower_sum_dim(ctx, x, dim, keepdim=False, dtype=None):
    return _reduce(ctx, x, _dims(x, dim), keepdim, "sum")


def _mean(ctx, x, dims, keepdim):
    acc = dtypes.compute_dtype(ctx.out_meta()[1])
    return _reduce(ctx, x, dims, keepdim, "sum",
                   final=lambda a, n: ops.truediv(a, ops.to_dtype(ops.index_expr(n, "int64"), acc)))


@register_lowering("mean.default")
def lower_mean(ctx, x, dtype=None):
    return _mean(ctx, x, _dims(x, None), False)


@register_lowering("mean.dim")
def lower_mean_dim(ctx, x, dim, keepdim=False, dtype=None):
    return _mean(ctx, x, _dims(x, dim), keepdim)


@register_lowering("prod.default")
def lower_prod(ctx, x, dtype=None):
    return _reduce(ctx, x, _dims(x, None), False, "prod")


@register_lowering("prod.dim_int")
def lower_prod_dim(ctx, x, dim, keepdim=False, dtype=None):
    return _reduce(ctx, x, _dims(x, dim), keepdim, "prod")


@register_lowering("amax.default")
def lower_amax(ctx, x, dim=(), keepdim=False):
    return _reduce(ctx, x, _dims(x, dim), keepdim, "max")


@register_lowering("amin.default")
def lower_amin(ctx, x, dim=(), keepdim=False):
    return _reduce(ctx, x, _dims(x, dim), keepdim, "min")


@register_lowering("max.default")
def lower_max_all(ctx, x):
    return _reduce(ctx, x, _dims(x, None), False, "max")


@register_lowering("min.default")
def lower_min_all(ctx, x):
    return _reduce(ctx, x, _dims(x, None), False, "min")


@register_lowering("argmax.default")
def lower_argmax(ctx, x, dim=None, keepdim=False):
    return _reduce(ctx, x, _dims(x, dim), keepdim and dim is not None, "argmax", acc_dtype="int64")


@register_lowering("argmin.default")
def lower_argmin(ctx, x, dim=None, keepdim=False):
    return _reduce(ctx, x, _dims(x, dim), keepdim and dim is not None, "argmin", acc_dtype="int64")


@register_lowering("max.dim")
def lower_max_dim(ctx, x, dim, keepdim=False):
    # Two reductions over the same rows; horizontal fusion puts them in one kernel.
    values = _reduce(ctx, x, _dims(x, dim), keepdim, "max")
    return values, _reduce(ctx, x, _dims(x, dim), keepdim, "argmax", acc_dtype="int64", out=1)


@register_lowering("min.dim")
def lower_min_dim(ctx, x, dim, keepdim=False):
    values = _reduce(ctx, x, _dims(x, dim), keepdim, "min")
    return values, _reduce(ctx, x, _dims(x, dim), keepdim, "argmin", acc_dtype="int64", out=1)


@register_lowering("any.default", "any.dim", "any.dims")
def lower_any(ctx, x, dim=None, keepdim=False):
    return _reduce(ctx, x, _dims(x, dim), keepdim, "any", acc_dtype="bool")


@register_lowering("all.default", "all.dim", "all.dims")
def lower_all(ctx, x, dim=None, keepdim=False):
    return _reduce(ctx, x, _dims(x, dim), keepdim, "all", acc_dtype="bool")


# --------------------------------------------------------------------------- Welford: var, std


def _welford(ctx, x, dims, keepdim, finals):
    _, dtype, device = ctx.out_meta()
    acc = dtypes.compute_dtype(dtype)
    return ctx.reduction(x.size, dims, keepdim, device, "welford", acc,
                         lambda idx: ops.to_dtype(x.load(idx), acc), finals)


def _var_final(correction, acc_dtype, sqrt=False):
    def final(acc, n):
        denom = ops.to_dtype(ops.index_expr(n, "int64"), acc_dtype)
        denom = ops.maximum(ops.sub(denom, ops.constant(float(correction), acc_dtype)), ops.constant(0.0, acc_dtype))
        var = ops.truediv(ops.getitem(acc, 1), denom)
        return ops.sqrt(var) if sqrt else var

    return final


def _correction(correction=None, unbiased=None) -> float:
    if correction is not None:
        return float(correction)
    return 0.0 if unbiased is False else 1.0


@register_lowering("var.correction", "var.dim")
def lower_var(ctx, x, dim=None, unbiased=None, keepdim=False, *, correction=None):
    if isinstance(unbiased, bool) or unbiased is None:
        corr = _correction(correction, unbiased)
    else:
        corr = float(unbiased)
    acc = dtypes.compute_dtype(ctx.out_meta()[1])
    [out] = _welford(ctx, x, _dims(x, dim), keepdim, [(ctx.out_meta()[1], _var_final(corr, acc))])
    return out


@register_lowering("std.correction", "std.dim")
def lower_std(ctx, x, dim=None, unbiased=None, keepdim=False, *, correction=None):
    corr = _correction(correction, unbiased if isinstance(unbiased, bool) else None)
    acc = dtypes.compute_dtype(ctx.out_meta()[1])
    [out] = _welford(ctx, x, _dims(x, dim), keepdim, [(ctx.out_meta()[1], _var_final(corr, acc, sqrt=True))])
    return out


@register_lowering("var_mean.correction", "std_mean.correction")
def lower_var_mean(ctx, x, dim=None, *, correction=None, keepdim=False):
    dtype = ctx.out_meta()[1]
    acc = dtypes.compute_dtype(dtype)
    sqrt = ctx.node.target.startswith("std")
    var, mean = _welford(ctx, x, _dims(x, dim), keepdim,
                         [(dtype, _var_final(_correction(correction), acc, sqrt)),
                          (dtype, lambda a, n: ops.getitem(a, 0))])
    return var, mean


# --------------------------------------------------------------------------- normalisations


def _row_max(ctx, x, dim, acc):
    [m] = ctx.reduction(x.size, [dim], True, x.device, "max", acc,
                        lambda idx: ops.to_dtype(x.load(idx), acc), [(acc, lambda a, n: a)])
    return m


def _softmax(ctx, x, dim, log: bool):
    size, dtype, device = ctx.out_meta()
    acc = dtypes.compute_dtype(dtype)
    if x.rank == 0:
        return ctx.pointwise(size, dtype, device, lambda idx: ops.constant(0.0 if log else 1.0, acc))
    dim = dim % x.rank
    m = _row_max(ctx, x, dim, acc)

    def shifted(idx):
        return ops.sub(ops.to_dtype(x.load(idx), acc), load_broadcast(m, idx, size))

    e = ctx.pointwise(size, acc, device, lambda idx: ops.exp(shifted(idx)))
    [s] = ctx.reduction(size, [dim], True, device, "sum", acc, lambda idx: e.load(idx), [(acc, lambda a, n: a)])
    if log:
        return ctx.pointwise(size, dtype, device,
                             lambda idx: ops.sub(shifted(idx), ops.log(load_broadcast(s, idx, size))))
    # exp is recomputed rather than read back, so the exp buffer stays inside the kernel.
    return ctx.pointwise(size, dtype, device,
                         lambda idx: ops.truediv(ops.exp(shifted(idx)), load_broadcast(s, idx, size)))


@register_lowering("_softmax.default")
def lower_softmax(ctx, x, dim, half_to_float=False):
    return _softmax(ctx, x, dim, log=False)


@register_lowering("_log_softmax.default")
def lower_log_softmax(ctx, x, dim, half_to_float=False):
    return _softmax(ctx, x, dim, log=True)


@register_lowering("softmax.int")
def lower_softmax_int(ctx, x, dim, dtype=None):
    return _softmax(ctx, x, dim, log=False)


@register_lowering("log_softmax.int")
def lower_log_softmax_int(ctx, x, dim, dtype=None):
    return _softmax(ctx, x, dim, log=True)


@register_lowering("logsumexp.default")
def lower_logsumexp(ctx, x, dim, keepdim=False):
    size, dtype, device = ctx.out_meta()
    acc = dtypes.compute_dtype(dtype)
    dims = _dims(x, dim)
    [m] = ctx.reduction(x.size, dims, True, device, "max", acc, lambda idx: ops.to_dtype(x.load(idx), acc),
                        [(acc, lambda a, n: ops.where(ops.isinf(a), ops.constant(0.0, acc), a))])
    [s] = ctx.reduction(x.size, dims, keepdim, device, "sum", acc,
                        lambda idx: ops.exp(ops.sub(ops.to_dtype(x.load(idx), acc), load_broadcast(m, idx, x.size))),
                        [(acc, lambda a, n: a)])
    m_out = m if keepdim else _squeeze_dims(m, dims)
    return ctx.pointwise(size, dtype, device,
                         lambda idx: ops.add(ops.log(load_broadcast(s, idx, size)), load_broadcast(m_out, idx, size)))


def _squeeze_dims(v: TensorValue, dims: list[int]) -> TensorValue:
    from fireclay_loops.lowering.values import view

    keep = [k for k in range(v.rank) if k not in dims]

    def index_map(idx):
        full = [0] * v.rank
        for j, k in enumerate(keep):
            full[k] = idx[j]
        return full

    return view(v, [v.size[k] for k in keep], index_map)


@register_lowering("native_layer_norm.default")
def lower_native_layer_norm(ctx, x, normalized_shape, weight, bias, eps):
    size, dtype, device = ctx.out_meta()
    stat_dtype = ctx.out_meta(1)[1]
    acc = dtypes.compute_dtype(dtype)
    dims = list(range(x.rank - len(normalized_shape), x.rank))

    def rstd(a, n):
        var = ops.truediv(ops.getitem(a, 1), ops.to_dtype(ops.index_expr(n, "int64"), acc))
        return ops.rsqrt(ops.add(var, ops.constant(float(eps), acc)))

    mean, inv = ctx.reduction(x.size, dims, True, device, "welford", acc,
                              lambda idx: ops.to_dtype(x.load(idx), acc),
                              [(stat_dtype, lambda a, n: ops.getitem(a, 0)), (stat_dtype, rstd)])

    def out(idx):
        v = ops.mul(ops.sub(ops.to_dtype(x.load(idx), acc), ops.to_dtype(load_broadcast(mean, idx, size), acc)),
                    ops.to_dtype(load_broadcast(inv, idx, size), acc))
        if weight is not None:
            v = ops.mul(v, ops.to_dtype(load_broadcast(weight, idx, size), acc))
        if bias is not None:
            v = ops.add(v, ops.to_dtype(load_broadcast(bias, idx, size), acc))
        return v

    return ctx.pointwise(size, dtype, device, out), mean, inv




@register_lowering("native_layer_norm_backward.default")
def lower_native_layer_norm_backward(ctx, grad_out, x, normalized_shape, mean, rstd, weight, bias, output_mask):
    """The three gradients of a layer norm from two row sums and two column sums, so that the
    scheduler fuses them with their neighbours (a library call would read the rows twice and
    keep the gradient of the residual stream apart). With ``xhat = (x - mean) * rstd`` and
    ``dy = grad_out * weight``: ``grad_input = rstd / n * (n * dy - sum(dy) - xhat *
    sum(dy * xhat))`` over the ``n`` normalised elements of each row, ``grad_weight =
    sum(grad_out * xhat)`` and ``grad_bias = sum(grad_out)`` over the rows. A gradient the mask
    leaves out is undefined (None), as in eager."""
    size = x.size
    inner = list(range(x.rank - len(normalized_shape), x.rank))
    outer = [d for d in range(x.rank) if d not in inner]
    acc = dtypes.compute_dtype(x.dtype)

    def load(t, idx):
        return ops.to_dtype(load_broadcast(t, idx, size), acc)

    def xhat(idx):
        return ops.mul(ops.sub(load(x, idx), load(mean, idx)), load(rstd, idx))

    def dy(idx):
        g = load(grad_out, idx)
        return g if weight is None else ops.mul(g, load(weight, idx))

    # (a gradient is computed where the graph has a tensor for it: eager gives none for a
    # weight or bias the layer norm does not have, whatever the mask says)
    wanted = [bool(output_mask[k]) and ctx.node.outputs[k].is_tensor for k in range(3)]
    results: list[Any] = [None, None, None]
    if wanted[0]:
        dtype, device = ctx.out_meta(0)[1:]
        count = exprs.product(size[d] for d in inner)
        [sum_dy] = ctx.reduction(size, inner, True, device, "sum", acc, dy, [(acc, lambda a, _: a)])
        [sum_dy_xhat] = ctx.reduction(size, inner, True, device, "sum", acc,
                                      lambda idx: ops.mul(dy(idx), xhat(idx)), [(acc, lambda a, _: a)])

        def grad_input(idx):
            n = ops.to_dtype(ops.index_expr(count, "int64"), acc)
            centred = ops.sub(ops.sub(ops.mul(n, dy(idx)), load(sum_dy, idx)),
                              ops.mul(xhat(idx), load(sum_dy_xhat, idx)))
            return ops.mul(ops.truediv(load(rstd, idx), n), centred)

        results[0] = ctx.pointwise(size, dtype, device, grad_input)
    for k, value in ((1, lambda idx: ops.mul(load(grad_out, idx), xhat(idx))), (2, lambda idx: load(grad_out, idx))):
        if not wanted[k]:
            continue
        dtype, device = ctx.out_meta(k)[1:]
        if outer:
            [results[k]] = ctx.reduction(size, outer, False, device, "sum", acc, value, [(dtype, lambda a, _: a)])
        else:  # one row: nothing to sum over
            results[k] = ctx.pointwise(size, dtype, device, value)
    return tuple(results)


@register_lowering("_native_batch_norm_legit_no_training.default")
def lower_batch_norm_inference(ctx, x, weight, bias, running_mean, running_var, momentum, eps):
    """Normalise with the running statistics (per channel, dim 1); the saved statistics are
    empty in inference, as in eager."""
    size, dtype, device = ctx.out_meta()
    acc = dtypes.compute_dtype(dtype)

    def channel(t, idx):
        return ops.to_dtype(t.load([idx[1]]), acc)

    def out(idx):
        inv = ops.rsqrt(ops.add(channel(running_var, idx), ops.constant(float(eps), acc)))
        v = ops.mul(ops.sub(ops.to_dtype(x.load(idx), acc), channel(running_mean, idx)), inv)
        if weight is not None:
            v = ops.mul(v, channel(weight, idx))
        if bias is not None:
            v = ops.add(v, channel(bias, idx))
        return v

    empties = [ctx.constant(0.0, *ctx.out_meta(k)) for k in (1, 2)]
    return (ctx.pointwise(size, dtype, device, out), *empties)


@register_lowering("_native_batch_norm_legit.no_stats")
def lower_batch_norm_training_no_stats(ctx, x, weight, bias, training, momentum, eps):
    """Training-mode batch norm without running statistics: per-channel Welford over every
    dim but 1, then the pointwise normalisation; returns (out, mean, rstd)."""
    out, mean, inv, _ = _batch_norm_with_batch_statistics(ctx, x, weight, bias, eps, unbiased_dtype=None)
    return out, mean, inv


@register_lowering("_native_batch_norm_legit_functional.default")
def lower_batch_norm_training(ctx, x, weight, bias, running_mean, running_var, training, momentum, eps):
    """Training-mode batch norm as functionalization leaves it: (out, mean, rstd) as without
    running statistics, and the updated running mean and variance (the batch's unbiased
    variance, as eager) as values of their own. Loop code rather than a library call, so the
    statistics are a reduction the scheduler places (a column reduction over channels-last
    activations) and the normalisation fuses with the ReLU after it."""
    if not training or running_mean is None or running_var is None:
        from fireclay_loops.lowering.context import fallback

        return fallback(ctx)
    out, mean, inv, var = _batch_norm_with_batch_statistics(ctx, x, weight, bias, eps,
                                                           unbiased_dtype=ctx.out_meta(4)[1])
    m = float(momentum)

    def running(old, new, k):
        size, dtype, device = ctx.out_meta(k)
        acc = dtypes.compute_dtype(dtype)

        def value(idx):
            kept = ops.mul(ops.to_dtype(old.load(idx), acc), ops.constant(1.0 - m, acc))
            return ops.add(kept, ops.mul(ops.to_dtype(new.load(idx), acc), ops.constant(m, acc)))

        return ctx.pointwise(size, dtype, device, value)

    return out, mean, inv, running(running_mean, mean, 3), running(running_var, var, 4)


def _batch_norm_with_batch_statistics(ctx, x, weight, bias, eps, unbiased_dtype):
    """(out, mean, rstd, unbiased variance or None): one per-channel Welford reduction over
    every dim but 1 gives the statistics, then the pointwise normalisation."""
    size, dtype, device = ctx.out_meta()
    acc = dtypes.compute_dtype(dtype)
    dims = [d for d in range(x.rank) if d != 1]

    def count(n):
        return ops.to_dtype(ops.index_expr(n, "int64"), acc)

    def rstd(a, n):
        var = ops.truediv(ops.getitem(a, 1), count(n))
        return ops.rsqrt(ops.add(var, ops.constant(float(eps), acc)))

    finals = [(ctx.out_meta(1)[1], lambda a, n: ops.getitem(a, 0)), (ctx.out_meta(2)[1], rstd)]
    if unbiased_dtype is not None:
        finals.append((unbiased_dtype, lambda a, n: ops.truediv(
            ops.getitem(a, 1), ops.sub(count(n), ops.constant(1.0, acc)))))
    stats = ctx.reduction(x.size, dims, False, device, "welford", acc,
                          lambda idx: ops.to_dtype(x.load(idx), acc), finals)
    mean, inv = stats[0], stats[1]

    def out(idx):
        v = ops.mul(ops.sub(ops.to_dtype(x.load(idx), acc), ops.to_dtype(mean.load([idx[1]]), acc)),
                    ops.to_dtype(inv.load([idx[1]]), acc))
        if weight is not None:
            v = ops.mul(v, ops.to_dtype(weight.load([idx[1]]), acc))
        if bias is not None:
            v = ops.add(v, ops.to_dtype(bias.load([idx[1]]), acc))
        return v

    return ctx.pointwise(size, dtype, device, out), mean, inv, (stats[2] if unbiased_dtype is not None else None)
