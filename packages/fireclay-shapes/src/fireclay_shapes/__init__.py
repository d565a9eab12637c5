"""fireclay-shapes: symbolic shapes on sympy.

* :class:`ShapeEnv` makes symbols for sizes (hints, ranges, duck sizing, 0/1 specialisation),
  decides conditions on them and records the guards those decisions need;
* :class:`SymbolicInt` / :class:`SymbolicBool` are those sizes as Python values;
* :class:`GuardSet` holds guards, simplifies them and renders them as one Python expression;
* :func:`dumps` / :func:`parse` are the string form fireclay-ir stores (``"2*s0 + 1"``);
* :func:`python_code`, :func:`cpp_code` (with :data:`CPP_PRELUDE`), :func:`triton_code` print
  expressions as source.

The torch adapter (fake tensors, ``torch.SymInt`` backed by these symbols) is the optional
module ``fireclay_shapes.torch``; importing this package never imports torch.
"""

from ._env import DataDependentError, GuardViolation, ShapeEnv, SymbolInfo
from ._expr import ExprParseError, FloorDiv, Max, Min, Mod, ShapeError, as_expr, dumps, parse, symbol
from ._guards import GuardSet
from ._printers import CPP_PRELUDE, cpp_code, python_code, triton_code
from ._ranges import ValueRange, bound
from ._simplify import simplify_with_ranges
from ._symbolic import SymbolicBool, SymbolicInt, sym_max, sym_min, sym_not

__version__ = "0.1.0"

__all__ = [
    "CPP_PRELUDE", "DataDependentError", "ExprParseError", "FloorDiv", "GuardSet", "GuardViolation",
    "Max", "Min", "Mod", "ShapeEnv", "ShapeError", "SymbolInfo", "SymbolicBool", "SymbolicInt",
    "ValueRange", "as_expr", "bound", "cpp_code", "dumps", "parse", "python_code",
    "simplify_with_ranges", "sym_max", "sym_min", "sym_not", "symbol", "triton_code",
]
