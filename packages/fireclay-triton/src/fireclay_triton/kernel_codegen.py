"""One scheduled kernel as one ``@triton.jit`` function.

Built on fireclay-loops' kernel-emission kit (:mod:`fireclay_loops.backend`). Each node body is
replayed (``LoopBody.run``) on the handler of :mod:`fireclay_triton.op_templates` and
:mod:`fireclay_triton.reduction_templates`, which turns every ``ops.*`` call into one Triton
statement with its dependencies. Placement comes after, on demand, in the kit's scopes:

* a *pointwise* kernel is one flat block of ``XBLOCK`` points (``x`` index, 1D);
* a *reduction* kernel works on ``[XBLOCK, RBLOCK]`` tiles: outer points down, reduction
  points across. Values that read a reduction variable (``r``) live in the *loop* scope; the
  rest (``[XBLOCK, 1]``) in the *main* scope, before the loop when the loop needs them, after
  it when they read a reduction result.

*Persistent* reductions (the whole reduction fits one tile, ``RBLOCK >= rnumel``) have no loop:
everything is one scope, so a value loaded for one stage is reused by the next (softmax reads
its input once). *Looped* reductions run one ``for`` over ``r`` per stage
(``KernelNode.stage``): a node reading a reduction result of its own kernel runs in a later loop.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from dataclasses import dataclass

import sympy

from fireclay_loops import Kernel, backend
from fireclay_loops.backend import KernelEmitter, Scope, StagePlan
from fireclay_loops.backend.dtypes import needs_index64
from fireclay_shapes import triton_code
from fireclay_triton.errors import CodegenError
from fireclay_triton.op_templates import TritonValue
from fireclay_triton.reduction_templates import TritonKernelOps
from fireclay_triton.split_reduction import finisher_source, place_split_stage
from fireclay_triton.tiling import (
    COLUMN_PERSISTENT_LIMIT,
    NotSplittable,
    few_long_rows,
    reduces_columns,
    should_split,
    tiled_kernel,
)


@dataclass(kw_only=True)
class KernelSource(backend.KernelSource):
    """A kernel's Triton function, the arguments it takes, and how to launch it."""

    kind: str  # "pointwise", "tiled" (2D pointwise), "persistent", "looped" or "split"
    numel: sympy.Expr  # outer points
    rnumel: sympy.Expr  # reduction points (1 for pointwise kernels)
    index64: bool
    columns: bool = False  # a reduction whose accesses are contiguous along the outer points
    partials: int = 0  # split kernels: the workspace slots of partial results (per chunk and output)
    # ``checks``: the kernel's CheckSites with their assert messages: the launcher compiles it in
    # Triton's debug mode and, in the interpreter, raises the check's error
    # the ``@triton.jit`` function's name in the kernel module: ``k`` + a digest of its text written
    # with a placeholder name. Arguments are positional (``ptr0``, ``ptr1``...), so kernels that do
    # the same work on different buffers (the layers of a model) are one function, compiled once,
    # and a function's name is the same in every program and process (Triton's disk cache hits).
    function: str = ""


class _Outer(Scope):
    """The kernel's main scope. After a stage's loop, what its statements read of the loop is
    placed in the loop (``loop``), which is written out after them all."""

    loop: Scope | None = None

    def place(self, v: TritonValue) -> None:
        if self.loop is not None and v.in_loop():
            self.loop.place(v)
        else:
            super().place(v)


class _Loop(Scope):
    """A stage's loop over ``r``: what does not change along it is computed before it, unless it
    reads a reduction result of this very loop."""

    def __init__(self, parent: Scope, gen: TritonKernelGen):
        super().__init__(parent=parent)
        self.gen = gen

    def hoist(self, v: TritonValue) -> None:
        if v.post >= self.gen.stage:
            raise CodegenError(f"kernel {self.gen.kernel.name}: a reduction result is needed inside its own loop")
        super().hoist(v)


class TritonKernelGen(KernelEmitter):
    """The Triton renderer of one kernel: its kind (pointwise, tiled, persistent, looped,
    split), indexing, the loops over ``r`` and the function around them."""

    error = CodegenError

    def __init__(self, kernel: Kernel, buffer_dtype: Callable[[str], str],
                 storage_numel: Callable[[str], sympy.Expr], interpret: bool, persistent_limit: int,
                 tiled: bool = False, columns: bool = False, split: bool = False):
        super().__init__(kernel)
        self.storage_numel = storage_numel
        self.buffer_dtype = buffer_dtype
        self.interpret = interpret
        self.reducing = bool(kernel.rsizes)
        self.unit_shape = "[1, 1]" if self.reducing else "[1]"
        self.stored: dict[tuple[str, str], TritonValue] = {}  # (buffer, pointer text) -> value stored there
        self.finals: list[TritonValue] = []  # reduction results of the stage being generated
        self.stage = 0
        self.main: list[str] = []  # the function body, as placed so far
        self.loop_marks: dict[int, list[int]] = {}  # looped stage -> [its "for" line, its loop's end] in main
        self.max_results: dict[TritonValue, tuple[TritonValue, int]] = {}  # max result -> (the value reduced, its stage)
        self.canon_memo: dict[TritonValue, str] = {}
        self.arguments: dict[str, str] = {}  # buffer -> its pointer argument, in order of first use
        self.xnames = {v.name for v in kernel.xvars}
        rnumel = kernel.rnumel
        self.columns = columns
        if columns:
            persistent_limit = min(persistent_limit, COLUMN_PERSISTENT_LIMIT)
        if tiled:
            self.kind = "tiled"
        elif not self.reducing:
            self.kind = "pointwise"
        elif rnumel.is_Integer and int(rnumel) <= persistent_limit:
            self.kind = "persistent"
        else:
            self.kind = "looped"
        self.split = split and self.kind == "looped"
        if self.split:
            self.kind = "split"
        self.looped = self.kind in ("looped", "split")
        self.slots = 0  # split kernels: workspace slots of partial results so far
        self.split_partials: list[TritonValue] = []  # split kernels: this stage's partial results, after the loop
        self.finisher: list[str] = []  # split kernels: the finisher's body
        self.finisher_seen: set[TritonValue] = set()
        self.index64 = needs_index64(kernel, storage_numel)
        self.check_messages: list[str] = []  # the assert message of each of self.checks

    def argument(self, buf: str) -> str:
        """The pointer argument that stands for ``buf`` in the kernel's text."""
        found = self.arguments.get(buf)
        if found is None:
            found = self.arguments[buf] = f"ptr{len(self.arguments)}"
        return found

    def index(self, expr) -> tuple[str, list[TritonValue], frozenset]:
        """Triton text of an index expression, the indirect values it reads, and its block axes."""
        expr, deps = self.read_index(expr)
        names = {s.name for s in expr.free_symbols}
        dims = {"x"} if names & self.xnames else set()
        dims |= {"r"} if names & self.rnames else set()
        return triton_code(expr, ranges=self.symbol_range), deps, frozenset(dims.union(*(d.dims for d in deps)))

    def size_text(self, expr) -> str:
        return self.index(expr)[0]

    # -- generation
    def generate(self) -> KernelSource:
        outer = _Outer()  # its lines are swapped per phase: before a loop, after it
        for stage, nodes in self.stages().items():
            if self.looped:
                self.cse = {}  # values of an earlier loop are out of scope
            self.roots = []
            self.finals = []
            self.stage = stage
            for kn in nodes:
                kn.node.body.run(TritonKernelOps(self, self.flat_reduction_index(kn)), kn.var_map)
            self._place_stage(outer)
        return self._function(self.main)

    def _place_stage(self, outer: _Outer) -> None:
        main = self.main
        if self.split:
            place_split_stage(self, main, outer.seen)
            return
        looped = self.looped
        # what varies goes in the loop, the rest after it (with the results of reductions whose
        # stores are internal); what the loop needs of that is hoisted before it
        plan = StagePlan()
        plan.add(self.roots + self.finals, after=True)
        outer.lines = pre = []
        loop = _Loop(outer, self) if looped else outer
        loop.place_all(plan.in_loop)
        outer.lines, outer.loop = [], loop if looped else None
        outer.place_all(plan.after)
        post, outer.loop = outer.lines, None
        main.extend(pre)
        if looped and loop.lines:
            start = len(main)
            main.append("for roffset in range(0, rnumel, RBLOCK):")
            main.extend("    " + ln for ln in self._r_defs("roffset + rbase") + loop.lines)
            self.loop_marks[self.stage] = [start, len(main)]
        main.extend(post)

    def _r_defs(self, rindex: str) -> list[str]:
        """The reduction points of a tile starting at ``rindex``: their mask and variables."""
        rdefs = [f"rindex = {rindex}", "rmask = rindex < rnumel", "xrmask = xmask & rmask"]
        return rdefs + self._var_defs("r", "rindex")

    def _var_defs(self, which: str, flat: str) -> list[str]:
        """Each ``x`` (or ``r``) variable from the flat index ``flat`` of the block's points."""
        lines = []
        for name, inner, size in self.unflatten(which):
            text = flat if inner == 1 else f"{flat} // ({self.size_text(inner)})"
            lines.append(f"{name} = " + (text if size is None else f"({text}) % ({self.size_text(size)})"))
        return lines

    def _function(self, body: list[str]) -> KernelSource:
        k = self.kernel
        i64 = ".to(tl.int64)" if self.index64 else ""
        itype = "tl.int64" if self.index64 else "tl.int32"
        # a reduction kernel's block is [XBLOCK, RBLOCK] (outer points down), a pointwise one [XBLOCK]
        column = "[:, None]" if self.reducing else ""
        head = [f"xoffset = tl.program_id(0){i64} * XBLOCK",
                f"xindex = xoffset + tl.arange(0, XBLOCK){column}{i64}", "xmask = xindex < xnumel"]
        if self.reducing:
            head += [f"rbase = tl.arange(0, RBLOCK)[None, :]{i64}", f"zx = tl.zeros([XBLOCK, 1], {itype})",
                     f"zxr = tl.zeros([XBLOCK, RBLOCK], {itype})"]
        else:
            head += [f"zx = tl.zeros([XBLOCK], {itype})"]
        head += self._var_defs("x", "xindex")
        if self.kind == "split":
            head += [f"rstart = tl.program_id(1){i64} * rchunk"]
        elif self.kind in ("persistent", "tiled"):  # a tiled kernel's columns come from grid axis 1
            tile = "rbase" if self.kind == "persistent" else f"tl.program_id(1){i64} * RBLOCK + rbase"
            head += self._r_defs(tile)
        buffers = list(self.arguments)
        symbols = sorted(self.symbols)
        params = [self.arguments[b] for b in buffers] + symbols + \
            (["ws", "rchunk: tl.constexpr" if self.interpret else "rchunk"] if self.split else []) + ["xnumel"]
        # Triton's interpreter cannot loop to a runtime bound (numpy refuses int() of its 1-element
        # arrays): there the reduction length is a compile-time constant, which costs nothing.
        rnumel = "rnumel: tl.constexpr" if self.interpret and self.looped else "rnumel"
        params += [rnumel, "XBLOCK: tl.constexpr", "RBLOCK: tl.constexpr"] if self.reducing else \
            ["XBLOCK: tl.constexpr"]

        def text(function: str) -> str:
            lines = ["@triton.jit", f"def {function}({', '.join(params)}):"]
            lines += ["    " + ln for ln in head + body]
            source = "\n".join(lines) + "\n"
            if self.split:
                source += "\n" + finisher_source(function, params, self._var_defs("x", "xindex"), self.finisher,
                                                 self.index64)
            return source

        function = "k" + hashlib.sha256(text("kernel").encode()).hexdigest()[:20]
        return KernelSource(name=k.name, source=text(function), buffers=buffers, symbols=symbols, kind=self.kind,
                            numel=k.numel, rnumel=k.rnumel if self.reducing else sympy.Integer(1),
                            index64=self.index64, columns=self.columns, partials=self.slots,
                            checks=list(zip(self.checks, self.check_messages)), function=function)


def generate_kernel(kernel: Kernel, buffer_dtype: Callable[[str], str],
                    storage_numel: Callable[[str], sympy.Expr], interpret: bool,
                    persistent_limit: int = 16384) -> KernelSource:
    """Triton for one kernel. ``storage_numel(buffer)`` is the elements a buffer spans (it decides
    32- or 64-bit indexing); ``interpret`` spells math for Triton's CPU interpreter; reductions of
    at most ``persistent_limit`` points are persistent (column reductions: at most
    ``COLUMN_PERSISTENT_LIMIT``); pointwise kernels whose accesses are contiguous along different
    variables are 2D tiled (see :mod:`fireclay_triton.tiling`)."""
    def generate(kernel: Kernel, **shape: bool) -> KernelSource:
        return TritonKernelGen(kernel, buffer_dtype, storage_numel, interpret, persistent_limit, **shape).generate()

    tiled = tiled_kernel(kernel)
    if tiled is not None:
        return generate(tiled, tiled=True)
    columns = reduces_columns(kernel)
    if (columns and should_split(kernel)) or few_long_rows(kernel):
        try:
            return generate(kernel, columns=columns, split=True)
        except NotSplittable:
            pass  # an epilogue or another reduction: one program per column block
    try:
        return generate(kernel, columns=columns)
    except CodegenError:
        if not columns:
            raise
        # the loop structure a column-shaped looped kernel needs did not fit: one tile, as for rows
        return generate(kernel)
