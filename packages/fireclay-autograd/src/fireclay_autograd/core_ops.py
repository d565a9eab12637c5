"""The core ATen op set: what graphs leave fireclay-autograd made of.

Every op a traced program reaches is kept if it is in the set; otherwise it is decomposed
(using torch's decomposition tables as the statement of its semantics) until only core ops,
or ops with no decomposition at all, remain. The set is fireclay-ir's aten registry list
(:func:`fireclay_ir.dialects.core_ops`, PyTorch's Core ATen IR) plus the few ops this package
keeps on purpose, listed in ``KEPT_ON_PURPOSE``.
"""

from __future__ import annotations

from fireclay_ir.dialects import core_ops

# Ops outside Core ATen that we keep whole: their decompositions would hide structure a kernel
# compiler wants, or they are the functional forms that functionalization itself produces
# (functional batch norm returns the new running statistics).
KEPT_ON_PURPOSE: tuple[str, ...] = (
    "aten::_batch_norm_with_update_functional.default",
    "aten::_native_batch_norm_legit_functional.default",
    "aten::copy.default",
    "aten::alias.default",
    "aten::zero.default",
    "aten::fill.Scalar",
    "aten::fill.Tensor",
    # Fused attention stays one extern call. Its decomposition also returns the attention
    # probabilities where the backward op expects the log-sum-exp, so it must not be split.
    "aten::_scaled_dot_product_flash_attention_for_cpu.default",
    "aten::_scaled_dot_product_flash_attention_for_cpu_backward.default",
    "aten::_scaled_dot_product_efficient_attention.default",
    "aten::_scaled_dot_product_efficient_attention_backward.default",
    "aten::_scaled_dot_product_flash_attention.default",
    "aten::_scaled_dot_product_flash_attention_backward.default",
)

CORE_OPS: frozenset[str] = frozenset(core_ops()) | frozenset(KEPT_ON_PURPOSE)


def is_core(op: str) -> bool:
    """Whether ``op`` (``aten::add.Tensor``) belongs to the core set."""
    return op in CORE_OPS
