"""The kernel-emission kit: what every code generator of a scheduled kernel does the same way,
whatever text it writes.

A generator replays each node body of a kernel (``LoopBody.run``) on an ops handler, a subclass
of :class:`KernelOps`: every ``ops.*`` call becomes a :class:`Value`, a statement of the target
language with the values it reads. The handler has one method per name of the loop-body
vocabulary: the math ops go to the renderer's :meth:`KernelOps.unary` / :meth:`KernelOps.binary`
(its op templates) unless it defines the op's own method; ``reduction`` goes to one method per
reduction kind (``reduce_sum(dtype=, src_dtype=, value=)``...), which by default all call the
renderer's :meth:`KernelOps.accumulate`.

Placement comes after, on demand: a :class:`Scope` declares a value after its dependencies
the first time a statement needs it; a scope inside a reduction loop hoists what does not
change along the loop (``Value.in_loop``) into its parent, before the loop. A :class:`StagePlan`
says which statements of a stage go in its loop (those that vary along it), after it or before.

:class:`KernelEmitter` is what a generator tracks about its kernel: the buffers it touches, the
size symbols and indirect index values it uses, fresh names, the values already computed (for
common subexpressions), the statements of the node being replayed (``roots``), the kernel's
nodes grouped in stages (one reduction loop each) and each node's flat reduction index.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

import sympy

from fireclay_loops.errors import check_failure
from fireclay_loops.exprs import UNBOUNDED, FloorDiv, Mod, loop_range, simplify
from fireclay_loops.kernel import Kernel, KernelNode
from fireclay_loops.ops import BINARY, REDUCTION_TYPES, UNARY
from fireclay_shapes import ValueRange

NONNEGATIVE = ValueRange(0, math.inf)


@dataclass(eq=False, kw_only=True)
class Value:
    """One statement of generated code: ``code`` defines ``name`` (or performs a side effect,
    a store), after the values in ``deps``. Compared by identity: two equal texts in two scopes
    are two values."""

    name: str
    code: str
    deps: list[Value] = field(default_factory=list)
    # (op name, operand values...) where a renderer records it, for the patterns it looks for
    # (:mod:`fireclay_loops.backend.patterns`); a cast between floating-point types is
    # ``("float_cast", x)``
    op: tuple[Any, ...] = ()
    varying: bool | None = None  # changes along the reduction loop (None: if a value it reads does)

    def in_loop(self) -> bool:
        """Whether it must be computed inside the reduction loop; the rest is hoisted out."""
        if self.varying is None:
            self.varying = any(d.in_loop() for d in self.deps)
        return self.varying


class Scope:
    """Where declarations go; a value declared in a scope is visible in its inner scopes."""

    def __init__(self, lines: list[str] | None = None, parent: Scope | None = None):
        self.lines = [] if lines is None else lines
        self.parent = parent
        self.seen: set[Value] = set()  # the values themselves: ids of freed values get reused

    def visible(self, v: Value) -> bool:
        return v in self.seen or (self.parent is not None and self.parent.visible(v))

    def place(self, v: Value) -> None:
        """Declare ``v`` (after its dependencies) here unless it is visible here already; a
        value that does not change along this scope's loop goes to the parent scope."""
        if self.visible(v):
            return
        if self.parent is not None and not v.in_loop():
            self.hoist(v)  # loop-invariant: computed once, before the loop
            return
        for d in v.deps:
            self.place(d)
        if v.code:
            self.lines.extend(v.code.split("\n"))
        self.seen.add(v)

    def hoist(self, v: Value) -> None:
        """Place loop-invariant ``v`` in the parent scope (a renderer may refuse some)."""
        assert self.parent is not None
        self.parent.place(v)

    def place_all(self, values: Iterable[Value]) -> None:
        for v in values:
            self.place(v)


@dataclass(kw_only=True)
class StagePlan:
    """Where the statements of one stage go: ``before`` its reduction loop, ``in_loop`` or
    ``after`` it (the renderer decides which, and places them in its scopes)."""

    before: list[Value] = field(default_factory=list)
    in_loop: list[Value] = field(default_factory=list)
    after: list[Value] = field(default_factory=list)

    def add(self, roots: list[Value], after: bool) -> None:
        """Plan statements of the stage: those that vary along the loop go in it, the others
        ``after`` it (statements of a reduction, which read its result) or before it."""
        self.in_loop += [v for v in roots if v.in_loop()]
        (self.after if after else self.before).extend(v for v in roots if not v.in_loop())


@dataclass(frozen=True)
class CheckSite:
    """One check a generated kernel makes: the op (``check_bounds``, ``check_nonzero``) and
    what it guards, in the user's terms; :meth:`error` is what a failure raises."""

    op: str
    site: str

    def error(self, value: Any = None, size: Any = None) -> Exception:
        return check_failure(self.op, self.site, value, size)


@dataclass(kw_only=True)
class KernelSource:
    """A generated kernel: its text and the arguments it takes, in order (a renderer adds how
    to build or launch it)."""

    name: str  # the scheduled kernel's name
    source: str
    buffers: list[str]  # data pointers, in this order
    symbols: list[str]  # then integer sizes, in this order
    checks: list[Any] = field(default_factory=list)  # its CheckSites (a renderer may pair them)


def indent(lines: list[str], by: str = "  ") -> list[str]:
    return [by + ln for ln in lines]


class KernelEmitter:
    """What a kernel generator tracks about the kernel it writes, whatever its target (see the
    module docstring). A renderer subclasses it and adds its own decisions."""

    error: type[Exception] = RuntimeError  # what the renderer raises for a kernel it cannot write

    def __init__(self, kernel: Kernel) -> None:
        self.kernel = kernel
        self.internal: dict[str, Value] = {}  # internal buffer -> the value stored to it (never memory)
        self.buffers: dict[str, bool] = {}  # name -> written
        self.symbols: set[str] = set()
        self.indirect: dict[str, Any] = {}  # indirect index name -> the generator's value of it
        self.counter = 0
        self.sizes = {v.name: s for v, s in zip(kernel.xvars + kernel.rvars, kernel.xsizes + kernel.rsizes)}
        self.rnames = {v.name for v in kernel.rvars}
        self.cse: dict[Any, Value] = {}  # key of a computation -> the value that computed it
        self.roots: list[Value] = []  # statements of the node(s) being replayed: stores, updates
        self.checks: list[CheckSite] = []  # the kernel's ops.check_* sites, by their number

    def fresh(self, prefix: str) -> str:
        self.counter += 1
        return f"{prefix}{self.counter}"

    def internal_value(self, buf: str) -> Value:
        """What the kernel stored to its internal buffer ``buf`` (a read of it is that value)."""
        if buf not in self.internal:
            raise self.error(f"{buf} is read in {self.kernel.name} before the kernel computes it")
        return self.internal[buf]

    def read_index(self, expr: Any) -> tuple[sympy.Expr, list[Value]]:
        """``expr`` as sympy and the indirect index values it reads, by name (the same text in
        every process: a set of symbols iterates in an order that varies with string hashing);
        the size symbols it names become arguments of the kernel. Digits of the kernel's loops
        that a view split apart and the composition left behind are folded over the loops'
        ranges (``804112*FloorDiv(x0, 16) + 50257*Mod(x0, 16)`` is ``50257*x0``)."""
        expr = sympy.sympify(expr)
        if expr.has(FloorDiv, Mod):
            expr = simplify(expr, self.sizes)
        deps = []
        for s in sorted(expr.free_symbols, key=lambda s: s.name):
            if s.name in self.indirect:
                deps.append(self.indirect[s.name])
            elif s.name not in self.sizes:
                self.symbols.add(s.name)
        return expr, deps

    def use_buffer(self, buf: str, write: bool) -> None:
        self.buffers[buf] = self.buffers.get(buf, False) or write

    def add_check(self, op: str, site: str) -> int:
        """Number a check of the kernel (``op``: ``check_bounds`` or ``check_nonzero``); the
        generated code reports a failure by this number, the wrapper raises from :attr:`checks`."""
        self.checks.append(CheckSite(op=op, site=site))
        return len(self.checks) - 1

    def cached(self, key: Any, make: Callable[[], Value]) -> Value:
        """The value computed for ``key`` already, else ``make()``, remembered: the nodes of a
        fused kernel repeat loads and math (a GELU and its gradient both take erf of the same
        input)."""
        found = self.cse.get(key)
        if found is None:
            found = self.cse[key] = make()
        return found

    def symbol_range(self, s: sympy.Symbol) -> ValueRange:
        """A loop variable of static extent n is in [0, n - 1]; an indirect index or a size
        symbol is nonnegative; anything else is unknown."""
        name = s.name
        if name in self.sizes:
            return loop_range(self.sizes[name])
        if name in self.indirect or name.startswith(("s", "ind")):
            return NONNEGATIVE
        return UNBOUNDED

    def unflatten(self, which: str) -> list[tuple[str, sympy.Expr, sympy.Expr | None]]:
        """The kernel's ``x`` (or ``r``) variables of one flat row-major index ``i``, each as
        (name, ``inner``, ``size``): the variable is ``i // inner % size`` (``size`` None for
        the outermost, which needs no remainder)."""
        k = self.kernel
        names, sizes = (k.xvars, k.xsizes) if which == "x" else (k.rvars, k.rsizes)
        out: list[tuple[str, sympy.Expr, sympy.Expr | None]] = []
        for j, v in enumerate(names):
            inner = sympy.Integer(1)
            for s in sizes[j + 1:]:
                inner = inner * s
            out.append((v.name, inner, sizes[j] if j > 0 else None))
        return out

    @staticmethod
    def flat_reduction_index(kn: KernelNode) -> sympy.Expr:
        """The node's position along all its reduction variables, row-major (argmax's index)."""
        body = kn.node.body
        flat = sympy.Integer(0)
        for rv, size in zip(body.reduction_vars, body.reduction_sizes):
            flat = flat * size + kn.var_map.get(rv, rv)
        return flat

    def stages(self) -> dict[int, list[KernelNode]]:
        """The kernel's nodes by stage (``KernelNode.stage``), in stage order: a stage is one
        reduction loop, and a node reading a reduction result of its kernel runs in a later one."""
        grouped: dict[int, list[KernelNode]] = {}
        for kn in self.kernel.nodes:
            grouped.setdefault(kn.stage, []).append(kn)
        return dict(sorted(grouped.items()))


class KernelOps:
    """The ``ops`` handler of one node body: every name of the loop-body vocabulary is a method.
    A renderer defines the memory and value ops, :meth:`unary` and :meth:`binary` (its op
    templates; an op with its own method in the renderer wins), ``where`` and
    :meth:`accumulate` or the ``reduce_<kind>`` methods it spells differently."""

    def __init__(self, emitter: KernelEmitter):
        self.emitter = emitter

    # memory: an internal buffer of the kernel never reaches memory (a read of it is the value
    # stored); the rest is the renderer's load_memory and store_memory
    def load(self, buf: str, index: Any) -> Value:
        if buf in self.emitter.kernel.internal:
            return self.emitter.internal_value(buf)
        self.emitter.use_buffer(buf, write=False)
        return self.load_memory(buf, index, mask=None)

    def masked_load(self, buf: str, index: Any, mask: Value) -> Value:
        if buf in self.emitter.kernel.internal:
            return self.masked(self.emitter.internal_value(buf), mask)
        self.emitter.use_buffer(buf, write=False)
        return self.load_memory(buf, index, mask=mask)

    def store(self, buf: str, index: Any, value: Value) -> None:
        if buf in self.emitter.kernel.internal:
            self.emitter.internal[buf] = self.store_internal(buf, value)
        else:
            self.emitter.use_buffer(buf, write=True)
            self.store_memory(buf, index, value)

    def store_add(self, buf: str, index: Any, value: Value) -> None:
        # (never internal: a kernel that adds does nothing else, see ops.store_add)
        self.emitter.use_buffer(buf, write=True)
        self.add_memory(buf, index, value)

    def load_memory(self, buf: str, index: Any, mask: Value | None) -> Value:
        """The element of ``buf`` at ``index`` (where ``mask`` holds, else 0)."""
        raise NotImplementedError(f"{type(self).__name__} has no ops.load")

    def masked(self, value: Value, mask: Value) -> Value:
        """``value`` where ``mask`` holds, else 0 (a masked read of an internal buffer)."""
        raise NotImplementedError(f"{type(self).__name__} has no ops.masked_load")

    def store_internal(self, buf: str, value: Value) -> Value:
        """What a read of internal ``buf`` gives once ``value`` is stored to it (rounded as a
        trip through memory would round it, so fused half-precision code matches eager)."""
        return value

    def store_memory(self, buf: str, index: Any, value: Value) -> None:
        raise NotImplementedError(f"{type(self).__name__} has no ops.store")

    def add_memory(self, buf: str, index: Any, value: Value) -> None:
        """Add ``value`` to ``buf[index]``, where other points of the kernel may add too."""
        raise NotImplementedError(f"{type(self).__name__} has no ops.store_add")

    def store_reduction(self, buf: str, index: Any, value: Value) -> None:
        return self.store(buf, index, value)

    def reduction(self, dtype: str, src_dtype: str, reduction_type: str, value: Value) -> Value:
        if reduction_type not in REDUCTION_TYPES:
            raise ValueError(f"unknown reduction kind {reduction_type!r}; known: {', '.join(REDUCTION_TYPES)}")
        reduce: Callable[..., Value] = getattr(self, f"reduce_{reduction_type}")
        return reduce(dtype=dtype, src_dtype=src_dtype, value=value)

    def accumulate(self, kind: str, *, dtype: str, src_dtype: str, value: Value) -> Value:
        """A reduction of ``kind`` of ``value`` over the kernel's reduction variables."""
        raise NotImplementedError(f"{type(self).__name__} has no {kind} reduction")

    def reduce_sum(self, *, dtype: str, src_dtype: str, value: Value) -> Value:
        return self.accumulate("sum", dtype=dtype, src_dtype=src_dtype, value=value)

    def reduce_prod(self, *, dtype: str, src_dtype: str, value: Value) -> Value:
        return self.accumulate("prod", dtype=dtype, src_dtype=src_dtype, value=value)

    def reduce_max(self, *, dtype: str, src_dtype: str, value: Value) -> Value:
        return self.accumulate("max", dtype=dtype, src_dtype=src_dtype, value=value)

    def reduce_min(self, *, dtype: str, src_dtype: str, value: Value) -> Value:
        return self.accumulate("min", dtype=dtype, src_dtype=src_dtype, value=value)

    def reduce_any(self, *, dtype: str, src_dtype: str, value: Value) -> Value:
        return self.accumulate("any", dtype=dtype, src_dtype=src_dtype, value=value)

    def reduce_all(self, *, dtype: str, src_dtype: str, value: Value) -> Value:
        return self.accumulate("all", dtype=dtype, src_dtype=src_dtype, value=value)

    def reduce_argmax(self, *, dtype: str, src_dtype: str, value: Value) -> Value:
        return self.accumulate("argmax", dtype=dtype, src_dtype=src_dtype, value=value)

    def reduce_argmin(self, *, dtype: str, src_dtype: str, value: Value) -> Value:
        return self.accumulate("argmin", dtype=dtype, src_dtype=src_dtype, value=value)

    def reduce_welford(self, *, dtype: str, src_dtype: str, value: Value) -> Value:
        """Mean, m2 and count in one (``getitem`` takes them apart)."""
        return self.accumulate("welford", dtype=dtype, src_dtype=src_dtype, value=value)

    def check_bounds(self, value: Value, size: Any, negative: bool, site: str, mask: Value | None = None) -> Value:
        """``value`` itself, once checked in ``[0, size)`` (``[-size, size)`` when ``negative``)
        where ``mask`` holds; a failure is reported as :meth:`KernelEmitter.add_check` numbers it."""
        raise NotImplementedError(f"{type(self).__name__} has no ops.check_bounds")

    def check_nonzero(self, value: Value, site: str, mask: Value | None = None) -> Value:
        """``value`` itself, once checked nonzero (an integer divisor) where ``mask`` holds."""
        raise NotImplementedError(f"{type(self).__name__} has no ops.check_nonzero")

    def unary(self, name: str, a: Value) -> Value:
        raise NotImplementedError(f"{type(self).__name__} has no ops.{name}")

    def binary(self, name: str, a: Value, b: Value) -> Value:
        raise NotImplementedError(f"{type(self).__name__} has no ops.{name}")


def _unary_op(name: str) -> Callable[[KernelOps, Value], Value]:
    def op(self: KernelOps, a: Value) -> Value:
        return self.unary(name, a)

    op.__name__ = name
    return op


def _binary_op(name: str) -> Callable[[KernelOps, Value, Value], Value]:
    def op(self: KernelOps, a: Value, b: Value) -> Value:
        return self.binary(name, a, b)

    op.__name__ = name
    return op


for _name in UNARY:
    setattr(KernelOps, _name, _unary_op(_name))
for _name in BINARY:
    setattr(KernelOps, _name, _binary_op(_name))
