"""Op registries: ``torch``, ``aten`` and ``hop`` ship here; ``loops`` is reserved for fireclay-loops.

Public surface: :class:`Dialect`, :class:`OpDef`, :class:`Argument`, :class:`Return`,
:func:`get_dialect`, :func:`lookup_op`, :func:`register_dialect`, :func:`register_callable`,
:func:`register_custom_op` (``torch.library`` operators of other namespaces, in this process).
"""

from fireclay_ir.dialects.aten import (
    AtenDialect,
    core_aten_ops,
    core_ops,
    custom_op_name,
    is_custom_op,
    kept_whole_ops,
    kept_whole_reasons,
    register_custom_op,
    shipped_ops,
    split_op_name,
)
from fireclay_ir.dialects.hop import HopDialect
from fireclay_ir.dialects.registry import (
    NO_DEFAULT,
    Argument,
    Dialect,
    OpDef,
    Return,
    dialects,
    get_dialect,
    lookup_op,
    register_dialect,
)
from fireclay_ir.dialects.torch import TORCH, register_callable

register_dialect(TORCH)
register_dialect(AtenDialect())
register_dialect(HopDialect())

__all__ = [
    "NO_DEFAULT", "TORCH", "Argument", "Dialect", "OpDef", "Return", "core_aten_ops", "core_ops", "custom_op_name", "dialects",
    "get_dialect", "is_custom_op", "kept_whole_ops", "kept_whole_reasons",
    "lookup_op", "register_callable", "register_custom_op", "register_dialect", "shipped_ops", "split_op_name",
]
