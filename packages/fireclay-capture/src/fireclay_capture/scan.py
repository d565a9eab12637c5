"""torch's prototype ``associative_scan`` (``torch._higher_order_ops.associative_scan``) as the
capture sees it: the trace runs ``associative_scan`` below in its place, an ordinary function of
tensor ops, so the scan lands in the graph with the rest of the model.

torch's own function cannot be traced: it flattens its inputs with ``torch.utils._pytree``
(registries keyed by types) and, in ``combine_mode="generic"`` (any device but CUDA), calls the
combine function under ``torch.vmap``, one element of the scan dimension at a time. The scan here
does what vmap promises without it: element ``i`` of the result is ``combine_fn(result[i - 1],
xs[i])``, each call seeing single elements (the scan dimension taken away), so any combine
function torch accepts gives the same values. The graph grows with the scan's length (one
combine per element), as the sequential loop it replaces does.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch


def associative_scan(combine_fn: Callable, xs: Any, dim: int, reverse: bool = False,
                     combine_mode: str = "pointwise") -> Any:
    """The inclusive scan of ``xs`` (a tensor, or a tuple or list of same-shaped tensors) along
    ``dim`` with ``combine_fn``: torch's signature and results."""
    single = isinstance(xs, torch.Tensor)
    leaves = [xs] if single else list(xs)
    if not leaves or not all(isinstance(x, torch.Tensor) for x in leaves):
        raise ValueError("associative_scan: xs must be a tensor or a tuple or list of tensors")
    if combine_mode not in ("pointwise", "generic"):
        raise ValueError(f"Combine_mode must either 'pointwise' or 'generic', but got {combine_mode}")
    ndim = leaves[0].ndim
    if not -ndim <= dim < ndim or any(x.shape[dim] == 0 for x in leaves):
        raise ValueError("All xs leaves must at least have 'dim' number of dimensions and scan dimension > 0")
    dim = dim % ndim
    if reverse:
        leaves = [x.flip([dim]) for x in leaves]

    as_tuple = isinstance(xs, tuple)

    def combine(left: list, right: list) -> list:
        if single:
            return [combine_fn(left[0], right[0])]
        out = combine_fn(tuple(left), tuple(right)) if as_tuple else combine_fn(left, right)
        return [out] if isinstance(out, torch.Tensor) else list(out)

    carry = [x.select(dim, 0) for x in leaves]
    steps = [carry]
    for i in range(1, leaves[0].shape[dim]):
        carry = combine(carry, [x.select(dim, i) for x in leaves])
        steps.append(carry)
    out = [torch.stack([step[j] for step in steps], dim) for j in range(len(leaves))]
    if reverse:
        out = [x.flip([dim]) for x in out]
    return out[0] if single else tuple(out) if as_tuple else out


def is_torch_associative_scan(value: Any) -> bool:
    """Whether ``value`` is torch's ``associative_scan`` (its module already imported)."""
    import sys

    module = sys.modules.get("torch._higher_order_ops.associative_scan")
    return module is not None and value is getattr(module, "associative_scan", None)
