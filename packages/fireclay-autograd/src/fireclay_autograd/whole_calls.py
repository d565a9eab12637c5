"""Torch functions traced as their aten op rather than as its composite decomposition, so that a
check eager makes on the data reaches the graph.

``one_hot`` is a composite op: on fake (meta) tensors its kernel takes a path without eager's check
of the classes (an ``eq`` against ``arange``, where a class out of range gives a row of zeros, and
a negative one too). Called below autograd, the tracer sees ``aten::one_hot`` itself (fireclay-ir
keeps it whole) and fireclay-loops lowers it with the check. On real tensors the call runs
eager's own kernel, checks included. Its result is an integer tensor: no gradient is lost.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch


def _one_hot(tensor: torch.Tensor, num_classes: int = -1) -> torch.Tensor:
    with torch._C._AutoDispatchBelowAutograd():
        return torch.ops.aten.one_hot.default(tensor, num_classes)


_WHOLE: tuple[tuple[Callable, Callable], ...] = (
    (torch.nn.functional.one_hot, _one_hot),
)


def whole_call(fn: Any) -> Any:
    """What the executor calls for the torch function ``fn``: its whole-op form, or ``fn``."""
    for torch_fn, whole in _WHOLE:
        if fn is torch_fn:
            return whole
    return fn
