"""Which ops are decomposed while tracing, and into what.

The tracer asks :func:`decomposition_for` about every op that reaches it. A core op, or one
fireclay-ir lists as kept whole (see :mod:`fireclay_autograd.core_ops`), is recorded as is. Any other op is replaced by its
decomposition, run again under the tracer so that its parts are themselves decomposed. torch's
decomposition tables are used only as statements of what an op means; the choice of what to
decompose is ours.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch._decomp import core_aten_decompositions

from fireclay_autograd.core_ops import is_core
from fireclay_autograd.executor import op_name

_CURATED = core_aten_decompositions()

aten = torch.ops.aten


def _native_batch_norm(input, weight, bias, running_mean, running_var, training, momentum, eps):
    # native_batch_norm updates the running statistics without saying so in its schema; the
    # core op _native_batch_norm_legit declares those writes, so functionalization sees them.
    if training and running_mean is not None and running_var is not None:
        return aten._native_batch_norm_legit.default(input, weight, bias, running_mean, running_var,
                                                     True, momentum, eps)
    if training:
        return aten._native_batch_norm_legit.no_stats(input, weight, bias, True, momentum, eps)
    return aten._native_batch_norm_legit_no_training.default(input, weight, bias, running_mean, running_var,
                                                             momentum, eps)


_HALF_TYPES = (torch.float16, torch.bfloat16)


def _log_softmax(x, dim, half_to_float):
    # Only where a gradient is traced: the backward reads log_softmax's output, a tensor as large
    # as the input (a language model's loss: tokens x vocabulary, in float32). Whole, the op can
    # only be saved; in parts, the partitioner may save the row statistics (max, log of the sum)
    # and redo the pointwise rest inside the backward's kernel from the input the forward has.
    # Computed in float32 for half inputs, as eager's kernel accumulates.
    if not x.requires_grad:
        return NotImplemented
    result_dtype = torch.float32 if half_to_float else x.dtype
    if x.dtype in _HALF_TYPES:
        x = aten._to_copy.default(x, dtype=torch.float32)
    shifted = aten.sub.Tensor(x, aten.amax.default(x, [dim], True))
    log_sum = aten.log.default(aten.sum.dim_IntList(aten.exp.default(shifted), [dim], True))
    result = aten.sub.Tensor(shifted, log_sum)
    return result if result.dtype == result_dtype else aten._to_copy.default(result, dtype=result_dtype)


# Decompositions of our own, consulted before torch's table. A decomposition may return
# NotImplemented: the op is then recorded whole.
OWN_DECOMPOSITIONS: dict[torch._ops.OpOverload, Callable] = {
    aten.native_batch_norm.default: _native_batch_norm,
    aten._log_softmax.default: _log_softmax,
}


def decomposition_for(func: torch._ops.OpOverload) -> Callable | None:
    """The function to run instead of ``func`` while tracing, or None to record it."""
    if func in OWN_DECOMPOSITIONS:
        return OWN_DECOMPOSITIONS[func]
    name = op_name(func)
    if is_core(name):  # core ATen, and the ops fireclay-ir lists as kept whole (views among them)
        return None
    # Only the curated table: its decompositions produce aten ops, where the wider table's
    # reference implementations may produce prims.
    # (The table is a lazily filled mapping: ``in`` and ``[]`` work where ``.get`` does not.)
    if func in _CURATED:
        return _CURATED[func]
    try:
        composite = torch._C._dispatch_has_kernel_for_dispatch_key(func.name(), "CompositeImplicitAutograd")
    except RuntimeError:  # an op torch does not register by that name (size, stride...)
        return None
    if composite:
        return func.decompose
    return None
