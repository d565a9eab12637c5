"""Dynamic shapes: ``mark_dynamic``, automatic dynamic dims after a size change, and the bridge
to fireclay-shapes (symbols in a ShapeEnv, fake tensors whose sizes are ``torch.SymInt``).

A capture is static unless some input dim is dynamic; then every fake of that trace comes from
fireclay-shapes' FakeMode, sizes flow through the user's code as SymInts (their decisions become
ShapeEnv guards), and the graph's shapes and int arguments are expressions over the symbols.
"""

from __future__ import annotations

from typing import Any

import torch

from fireclay_capture.errors import Unsupported
from fireclay_capture.sources import ConstSource, Source
from fireclay_ir import SymExpr

_MARK = "_fireclay_dynamic_dims"


def mark_dynamic(t: torch.Tensor, dim: int | list[int], min: int | None = None, max: int | None = None) -> None:
    """Declare ``t``'s dimension ``dim`` dynamic (with optional bounds) before the first capture:
    the graph is traced with a symbol for that size instead of recompiling per size."""
    dims = [dim] if isinstance(dim, int) else list(dim)
    marks = dict(getattr(t, _MARK, {}))
    for d in dims:
        if not -t.dim() <= d < t.dim():
            raise IndexError(f"mark_dynamic: dimension {d} out of range for a {t.dim()}-d tensor")
        marks[d % t.dim()] = (min, max)
    setattr(t, _MARK, marks)


def marked_dims(t: torch.Tensor) -> dict[int, tuple[int | None, int | None]]:
    return dict(getattr(t, _MARK, {}))


def source_text(source: Source) -> str | None:
    """Python text of a source relative to ``L`` alone (None when it needs guard constants)."""
    if any(isinstance(p, ConstSource) for p in source.parts()):
        return None
    return source.expr({})


class ShapeSession:
    """The ShapeEnv and FakeMode of one dynamic trace."""

    def __init__(self) -> None:
        from fireclay_shapes import ShapeEnv
        from fireclay_shapes.torch import FakeMode

        self.env = ShapeEnv()
        self.mode = FakeMode(self.env)

    def fake_input(self, value: torch.Tensor, source: Source, dims: dict[int, tuple]) -> torch.Tensor:
        text = source_text(source)
        if not dims or text is None:
            return self.mode.from_real(value)
        if any(lo is not None or hi is not None for lo, hi in dims.values()):
            if not value.is_contiguous():
                raise Unsupported("bounded dynamic dims on a non-contiguous tensor")
            sizes = []
            for d, hint in enumerate(value.shape):
                if d in dims:
                    lo, hi = dims[d]
                    sizes.append(self.env.create_symbol(int(hint), f"{text}.size({d})", min=lo, max=hi))
                else:
                    sizes.append(int(hint))
            return self.mode.fake(sizes, None, dtype=value.dtype, device=value.device,
                                  requires_grad=value.requires_grad)
        sources = [f"{text}.size({d})" for d in range(value.dim())]
        return self.mode.from_real(value, dynamic_dims=sorted(dims), sources=sources)

    def guard_text(self) -> str:
        return self.env.render_guards()

    def symbols(self) -> list[tuple[str, int | None, int | None, int | None]]:
        out = []
        for name, info in self.env.symbols.items():
            if info.unbacked:
                continue
            lo, hi = info.declared.lo, info.declared.hi
            out.append((name, info.hint, _finite(lo), _finite(hi)))
        return out


def _finite(v) -> int | None:
    try:
        return int(v)
    except (TypeError, ValueError, OverflowError):
        return None


def is_symbolic(value: Any) -> bool:
    return isinstance(value, (torch.SymInt, torch.SymFloat, torch.SymBool))


def dim_of(d: Any) -> int | str:
    """A size as a TensorMeta dim: an int, or the expression string of a SymInt."""
    if isinstance(d, torch.SymInt):
        from fireclay_shapes import dumps
        from fireclay_shapes.torch import expr_of

        e = expr_of(d)
        return int(e) if e.is_Integer else dumps(e)
    return int(d)


def ir_symint(value: torch.SymInt) -> Any:
    dim = dim_of(value)
    return dim if isinstance(dim, int) else SymExpr(dim)


def python_of(value: Any, session: ShapeSession) -> str:
    """Python text computing a SymInt at run time from ``L``."""
    from fireclay_shapes.torch import expr_of

    return session.env.python_code(expr_of(value))


def concrete(v):
    """A symbolic size turned into its current value (the ShapeEnv guards that value)."""
    if isinstance(v, torch.SymInt):
        return int(v)
    if isinstance(v, torch.SymFloat):
        return float(v)
    if isinstance(v, torch.SymBool):
        return bool(v)
    return v
