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

# The serialized format and the text printer (docs/format/README.md).
from fireclay_ir.printer import format_graph, format_program  # noqa: E402
from fireclay_ir.serde import FormatError, Limits, dumps, load, loads, save  # noqa: E402
from fireclay_ir.upgraders import UPGRADERS, UpgraderRegistry  # noqa: E402

__all__ += [
    "FormatError", "Limits", "UPGRADERS", "UpgraderRegistry", "dumps", "format_graph", "format_program",
    "load", "loads", "save",
]

# Semantics: op registries, verifier, passes, reference interpreter, torch.fx interop (the last
# two import torch only when called).
from fireclay_ir.binding import bind_inputs  # noqa: E402
from fireclay_ir.dialects import (  # noqa: E402
    Argument,
    Dialect,
    OpDef,
    Return,
    get_dialect,
    lookup_op,
    register_callable,
    register_custom_op,
    register_dialect,
)
from fireclay_ir.fx_interop import FxConversionError, from_fx, to_fx  # noqa: E402
from fireclay_ir.interpreter import Interpreter, InterpreterError, evaluate_symexpr, interpret  # noqa: E402
from fireclay_ir.passes import GENERIC_PIPELINE, PassManager, Pattern  # noqa: E402
from fireclay_ir.run_limits import RunLimitError, RunLimits  # noqa: E402
from fireclay_ir.verifier import VerificationError, check_boundary, verify, verify_at_boundaries  # noqa: E402

__all__ += [
    "Argument", "bind_inputs", "Dialect", "FxConversionError", "GENERIC_PIPELINE", "Interpreter", "InterpreterError", "OpDef",
    "PassManager", "Pattern", "Return", "RunLimitError", "RunLimits", "VerificationError", "check_boundary", "evaluate_symexpr", "from_fx",
    "get_dialect", "interpret", "lookup_op", "register_callable", "register_custom_op", "register_dialect", "to_fx",
    "verify",
    "verify_at_boundaries",
]

# Settings: the one mechanism every package's section derives from, the shared section (cache
# folder, boundary verification), and the atomic file writer every stage's caches use.
from fireclay_ir.config import SharedSettings, config  # noqa: E402
from fireclay_ir.files import write_atomic  # noqa: E402
from fireclay_ir.settings import SettingInfo, Settings, setting  # noqa: E402

__all__ += ["SettingInfo", "Settings", "SharedSettings", "config", "setting", "write_atomic"]
