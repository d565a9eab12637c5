"""fireclay-ir: the program format every fireclay stage reads and writes.

The model (:class:`Program`, :class:`Graph`, :class:`Node`, :class:`Value`, :class:`TensorMeta`)
is specified in :mod:`fireclay_ir.model`.
"""

__version__ = "0.1.0"

from fireclay_ir.compat import IncompatibleSiblingError, require_sibling
from fireclay_ir.model import (
    DTYPES,
    FORMAT_VERSION,
    Device,
    Dim,
    DType,
    Graph,
    GraphRef,
    InputSpec,
    IRError,
    Layout,
    MemoryFormat,
    Node,
    Program,
    ScalarType,
    Symbol,
    SymExpr,
    TensorMeta,
    Value,
    Weight,
    iter_values,
    map_values,
)

__all__ = [
    "DTYPES", "FORMAT_VERSION", "Device", "Dim", "DType", "Graph", "GraphRef", "InputSpec",
    "IRError", "IncompatibleSiblingError", "Layout", "MemoryFormat", "Node", "Program",
    "ScalarType", "Symbol", "SymExpr", "TensorMeta", "Value", "Weight", "iter_values",
    "map_values", "require_sibling",
]
