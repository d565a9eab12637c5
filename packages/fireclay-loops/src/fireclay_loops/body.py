"""Loop bodies: small SSA graphs of ``ops.*`` calls, recorded define-by-run.

A :class:`LoopBody` is what one loop node computes at one point of its iteration space. Its
variables are ``i0, i1, ...`` (the outer, pointwise loops) and ``r0, r1, ...`` (the reduction
loops); index arguments are sympy expressions over them and over size symbols. Every value
carries its dtype (inferred while recording) so code generators can declare it.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import sympy

from fireclay_loops import exprs
from fireclay_loops.ops import BOOL_RESULT, MATH_OPS, MEMORY_OPS, REDUCTION_TYPES, use_handler


@dataclass(frozen=True)
class BodyValue:
    """The result of the ``index``-th op of a body."""

    index: int

    def __repr__(self) -> str:
        return f"%{self.index}"


@dataclass
class BodyOp:
    name: str
    args: tuple[Any, ...]
    dtype: str | None  # None for stores


class LoopBody:
    """Variables with their ranges, and the recorded ops in order."""

    def __init__(self, var_sizes: Sequence[Any], reduction_sizes: Sequence[Any] = ()):
        self.vars = [exprs.symbol(f"i{k}") for k in range(len(var_sizes))]
        self.sizes = [exprs.as_expr(s) for s in var_sizes]
        self.reduction_vars = [exprs.symbol(f"r{k}") for k in range(len(reduction_sizes))]
        self.reduction_sizes = [exprs.as_expr(s) for s in reduction_sizes]
        self.ops: list[BodyOp] = []

    def indirect_symbols(self) -> set[str]:
        return {op.args[2] for op in self.ops if op.name == "indirect_indexing"}

    @property
    def is_reduction(self) -> bool:
        return any(op.name == "reduction" for op in self.ops)

    def run(self, handler: Any, subs: dict[Any, Any] | None = None) -> list[Any]:
        """Replay the body on ``handler``; index expressions get ``subs`` (variable -> expr)
        substituted first. Returns each op's result."""
        results: list[Any] = []

        def arg(a: Any) -> Any:
            if isinstance(a, BodyValue):
                return results[a.index]
            if isinstance(a, sympy.Basic) and subs:
                return a.xreplace(subs)
            return a

        for op in self.ops:
            results.append(getattr(handler, op.name)(*(arg(a) for a in op.args)))
        return results

    def accesses(self, kinds: tuple[str, ...]) -> list[tuple[str, sympy.Expr, str]]:
        """``(buffer, index, op name)`` of the memory ops of the given kinds, in body order."""
        return [(op.args[0], op.args[1], op.name) for op in self.ops if op.name in kinds]

    def reads(self) -> list[tuple[str, sympy.Expr, str]]:
        return self.accesses(("load", "masked_load"))

    def writes(self) -> list[tuple[str, sympy.Expr, str]]:
        return self.accesses(("store", "store_reduction", "store_add"))

    @property
    def accumulates(self) -> bool:
        """Whether the body adds into a buffer (``ops.store_add``: a scatter-add)."""
        return any(op.name == "store_add" for op in self.ops)

    def rename_buffers(self, mapping: dict[str, str]) -> None:
        for op in self.ops:
            if op.name in MEMORY_OPS and op.args[0] in mapping:
                op.args = (mapping[op.args[0]],) + op.args[1:]


class BodyRecorder:
    """The handler that records ``ops.*`` calls into a :class:`LoopBody`."""

    def __init__(self, body: LoopBody, buffer_dtype: Callable[[str], str],
                 fresh_name: Callable[[str], str] | None = None):
        self.body = body
        self.buffer_dtype = buffer_dtype
        self._fresh = fresh_name or (lambda prefix: f"{prefix}{len(body.ops)}")
        self._var_sizes = {v.name: n for v, n in zip(body.vars + body.reduction_vars,
                                                     body.sizes + body.reduction_sizes)}

    @property
    def var_sizes(self) -> dict[str, Any]:
        """Range of every symbol an index may use here: loop variables and indirect indices."""
        return self._var_sizes

    def _simplify(self, index: Any) -> sympy.Expr:
        return exprs.simplify(index, self._var_sizes)

    def _add(self, name: str, args: tuple[Any, ...], dtype: str) -> BodyValue:
        """Record an op that gives a value."""
        self.body.ops.append(BodyOp(name, args, dtype))
        return BodyValue(len(self.body.ops) - 1)

    def _add_effect(self, name: str, args: tuple[Any, ...]) -> None:
        """Record an op that gives no value (a store)."""
        self.body.ops.append(BodyOp(name, args, None))

    def _dtype(self, v: BodyValue) -> str:
        if not isinstance(v, BodyValue):
            raise TypeError(f"loop-body op expected a value recorded in this body, got {v!r}")
        dtype = self.body.ops[v.index].dtype
        if dtype is None:  # pragma: no cover - stores give no value to refer to
            raise TypeError(f"loop-body op expected a value, got the store {v!r}")
        return dtype

    def load(self, buf: str, index: Any) -> BodyValue:
        return self._add("load", (buf, self._simplify(index)), self.buffer_dtype(buf))

    def masked_load(self, buf: str, index: Any, mask: BodyValue) -> BodyValue:
        return self._add("masked_load", (buf, self._simplify(index), mask), self.buffer_dtype(buf))

    def store(self, buf: str, index: Any, value: BodyValue) -> None:
        self._dtype(value)
        self._add_effect("store", (buf, self._simplify(index), value))

    def store_reduction(self, buf: str, index: Any, value: BodyValue) -> None:
        self._dtype(value)
        self._add_effect("store_reduction", (buf, self._simplify(index), value))

    def store_add(self, buf: str, index: Any, value: BodyValue) -> None:
        if self._dtype(value) != self.buffer_dtype(buf):
            raise TypeError(f"ops.store_add of a {self._dtype(value)} value into {buf}, a {self.buffer_dtype(buf)} buffer")
        self._add_effect("store_add", (buf, self._simplify(index), value))

    def constant(self, value: Any, dtype: str) -> BodyValue:
        return self._add("constant", (value, dtype), dtype)

    def index_expr(self, expr: Any, dtype: str) -> BodyValue:
        return self._add("index_expr", (self._simplify(expr), dtype), dtype)

    def to_dtype(self, x: BodyValue, dtype: str) -> BodyValue:
        if self._dtype(x) == dtype:
            return x
        return self._add("to_dtype", (x, dtype), dtype)

    def random(self, kind: str, seed: int, offset: Any) -> BodyValue:
        return self._add("random", (kind, int(seed), self._simplify(offset)), "float32")

    def indirect_indexing(self, value: BodyValue, size: Any, name: str | None = None) -> sympy.Symbol:
        """A symbol standing for ``value`` inside later index expressions (``name`` keeps the
        symbol of a body being re-recorded)."""
        self._dtype(value)
        name = name or self._fresh("ind")
        self._add("indirect_indexing", (value, exprs.as_expr(size), name), "int64")
        self._var_sizes[name] = exprs.as_expr(size)  # lowerings guarantee 0 <= value < size
        return exprs.symbol(name)

    def check_bounds(self, value: BodyValue, size: Any, negative: bool, site: str,
                     mask: BodyValue | None = None) -> BodyValue:
        self._dtype(value)
        return self._add("check_bounds", (value, exprs.as_expr(size), bool(negative), str(site), mask), "int64")

    def check_nonzero(self, value: BodyValue, site: str, mask: BodyValue | None = None) -> BodyValue:
        return self._add("check_nonzero", (value, str(site), mask), self._dtype(value))

    def reduction(self, dtype: str, src_dtype: str, reduction_type: str, value: BodyValue) -> BodyValue:
        if reduction_type not in REDUCTION_TYPES:
            raise ValueError(f"unknown reduction type {reduction_type!r}")
        self._dtype(value)
        return self._add("reduction", (dtype, src_dtype, reduction_type, value), dtype)

    def getitem(self, value: BodyValue, i: int) -> BodyValue:
        return self._add("getitem", (value, int(i)), self._dtype(value))

    def __getattr__(self, name: str) -> Callable[..., BodyValue]:
        if name not in MATH_OPS:
            raise AttributeError(name)
        arity = MATH_OPS[name]

        def call(*args: BodyValue) -> BodyValue:
            if len(args) != arity:
                raise TypeError(f"ops.{name} takes {arity} values, got {len(args)}")
            dtypes = [self._dtype(a) for a in args]
            dtype = "bool" if name in BOOL_RESULT else (dtypes[1] if name == "where" else dtypes[0])
            return self._add(name, tuple(args), dtype)

        return call


def record_body(var_sizes: Sequence[Any], reduction_sizes: Sequence[Any],
                fn: Callable[[list[Any], list[Any]], None], buffer_dtype: Callable[[str], str],
                fresh_name: Callable[[str], str] | None = None) -> LoopBody:
    """Run ``fn(vars, reduction_vars)`` under a recorder and return the recorded body.
    ``fresh_name(prefix)`` names indirect-index symbols uniquely within the program."""
    body = LoopBody(var_sizes, reduction_sizes)
    with use_handler(BodyRecorder(body, buffer_dtype, fresh_name)):
        fn(list(body.vars), list(body.reduction_vars))
    return body
