"""fireclay-shapes: Symbolic shapes on sympy."""

__version__ = "0.1.0"

