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


# Decompositions of our own, consulted before torch's table.
OWN_DECOMPOSITIONS: dict[torch._ops.OpOverload, Callable] = {
    aten.native_batch_norm.default: _native_batch_norm,
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
