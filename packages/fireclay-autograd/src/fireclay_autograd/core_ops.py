"""The core ATen op set: what graphs leave fireclay-autograd made of.

Every op a traced program reaches is kept if it is in the set; otherwise it is decomposed
(using torch's decomposition tables as the statement of its semantics) until only core ops,
or ops with no decomposition at all, remain. The set is data of fireclay-ir's aten registry:
:func:`fireclay_ir.dialects.core_aten_ops` (PyTorch's Core ATen IR) plus
:func:`fireclay_ir.dialects.kept_whole_ops` (ops kept whole on purpose, each with its reason in
:func:`fireclay_ir.dialects.kept_whole_reasons`).
"""

from __future__ import annotations

from fireclay_ir.dialects import core_aten_ops, kept_whole_ops

KEPT_ON_PURPOSE: tuple[str, ...] = kept_whole_ops()

CORE_OPS: frozenset[str] = frozenset(core_aten_ops()) | frozenset(KEPT_ON_PURPOSE)


def is_core(op: str) -> bool:
    """Whether ``op`` (``aten::add.Tensor``) belongs to the core set."""
    return op in CORE_OPS
