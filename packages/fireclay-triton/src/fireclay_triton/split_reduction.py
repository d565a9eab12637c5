"""The text of split reductions: a reduction with few outputs and a long reduction spread over
grid axis 1 (see :mod:`fireclay_loops.long_reductions` for which ones).

Each program of the split kernel reduces one chunk of the reduction for a block of outputs and
stores its *partial result* in a float32 workspace, ``ws[slot, chunk, x]``: a sum, a max or a
min takes one slot, a Welford triple (mean, m2, count) three. The *finisher*, a second kernel
over the outputs alone, loads the ``nsplit`` partials of each output, combines them in a fixed
order (so results do not depend on timing; no atomics), and then runs everything the kernel
computes over the outputs alone after the reduction: batch norm's per-channel scaling of a sum,
a mean's division, the stores. Code over the reduction loop after a reduction cannot be split
(the scheduler keeps such epilogues in their own kernels for a GPU).
"""

from __future__ import annotations

from typing import Any

from fireclay_loops.backend.reductions import REDUCTIONS
from fireclay_loops.long_reductions import SPLITTABLE
from fireclay_triton.tiling import NotSplittable

__all__ = ["SPLITTABLE", "chan_merge", "combined_lines", "finisher_source", "lanes_folded", "partial_lines",
           "place_split_stage", "slot_names", "split_result"]

_OTHER = {"sum": "0", "max": 'float("-inf")', "min": 'float("inf")'}


def slot_names(kind: str, res: str) -> list[str]:
    """The values a reduction's partial result stores, one workspace slot each."""
    return [f"{res}_mean", f"{res}_m2", f"{res}_w"] if kind == "welford" else [res]


def chan_merge(res: str, weights: str, weighted_means: str, deviation: str, m2_terms: str) -> list[str]:
    """Welford states (of lanes, or of chunks) merged across axis 1 into ``res_w``, ``res_mean``
    and ``res_m2`` by Chan's formula: M2 = sum(m2_i) + sum(w_i * (mean_i - mean)**2), with
    ``res_dm`` the ``deviation`` of each from the mean."""
    return [f"{res}_w = tl.sum({weights}, 1)[:, None]",
            f"{res}_mean = tl.sum({weighted_means}, 1)[:, None] / tl.where({res}_w == 0, 1.0, {res}_w)",
            f"{res}_dm = {deviation}",
            f"{res}_m2 = tl.sum({m2_terms}, 1)[:, None]"]


def lanes_folded(kind: str, acc: str, interpret: bool) -> str:
    """A tile ``acc`` of the states of a one-part reduction (fireclay-loops' reduction forms)
    folded across axis 1: Triton's builtin sum, max or min where they fold alike, else its
    combine function (the interpreter runs one element by element: there max and min are
    numpy's, which keep NaN, as fc_maximum does). any and all hold truths as int8."""
    fold = REDUCTIONS[kind].fold
    if fold == "add":
        return f"tl.sum({acc}, 1)"
    if fold in ("logical_or", "logical_and"):
        return f"tl.{'max' if fold == 'logical_or' else 'min'}({acc}, 1) != 0"
    if interpret and fold in ("maximum", "minimum"):
        return f"tl.{fold[:3]}({acc}, 1)"
    return f"tl.reduce({acc}, 1, {'fc_prod_combine' if fold == 'mul' else 'fc_' + fold})"


def _ws(slot: int, chunk: str, count: str) -> str:
    return f"ws + (({slot} * {count} + {chunk}) * xnumel + xindex)"


def partial_lines(kind: str, res: str, lane_result: str, slot: int) -> list[str]:
    """Split kernel, after its loop: this program's partial result (``lane_result``: the lines
    that reduce the accumulator's lanes into ``res``), stored from ``slot`` on."""
    lines = lane_result.split("\n")
    for k, name in enumerate(slot_names(kind, res)):
        lines.append(f"tl.store({_ws(slot + k, 'tl.program_id(1)', 'tl.num_programs(1)')}, {name}, xmask)")
    return lines


def combined_lines(kind: str, res: str, slot: int, interpret: bool) -> list[str]:
    """Finisher: the partial results of each output (``[XBLOCK, NSPLIT]``) combined into the
    reduction's result, named as the unsplit kernel names it (``res``, or ``res_mean``,
    ``res_m2``, ``res_w`` for Welford)."""
    def load(k: int, other: str) -> str:
        return f"tl.load({_ws(slot + k, 'pindex', 'nsplit')}, pmask, other={other})"

    if kind == "welford":
        loads = [f"{res}_pm = {load(0, '0')}", f"{res}_p2 = {load(1, '0')}", f"{res}_pw = {load(2, '0')}"]
        return loads + chan_merge(res, f"{res}_pw", f"{res}_pw * {res}_pm", f"{res}_pm - {res}_mean",
                                  f"{res}_p2 + {res}_pw * {res}_dm * {res}_dm")
    part = load(0, _OTHER[kind])
    return [f"{res}_p = {part}", f"{res} = ({lanes_folded(kind, f'{res}_p', interpret)})[:, None]"]


def finisher_source(name: str, params: list[str], xdefs: list[str], body: list[str], index64: bool) -> str:
    """The finisher of split kernel ``name``: its pointer and size arguments, the workspace, and
    ``body`` (the combined results and the code over the outputs that follows them)."""
    prefix = params[: params.index("ws")]
    i64 = ".to(tl.int64)" if index64 else ""
    args = prefix + ["ws", "nsplit", "xnumel", "XBLOCK: tl.constexpr", "NSPLIT: tl.constexpr"]
    lines = ["@triton.jit",
             f"def {name}_finish({', '.join(args)}):",
             f"    xoffset = tl.program_id(0){i64} * XBLOCK",
             f"    xindex = xoffset + tl.arange(0, XBLOCK)[:, None]{i64}",
             "    xmask = xindex < xnumel",
             f"    zx = tl.zeros([XBLOCK, 1], {'tl.int64' if index64 else 'tl.int32'})",
             "    pindex = tl.arange(0, NSPLIT)[None, :]",
             "    pmask = xmask & (pindex < nsplit)"]
    lines += ["    " + d for d in xdefs + body]
    return "\n".join(lines) + "\n"


# --------------------------------------------------------------------------- the kernel generator's side
# ``gen`` is fireclay_triton.kernel_codegen's generator, its values ``TritonValue`` statements:
# these functions only read and make such values.


def split_result(gen: Any, kind: str, dtype: str, done: Any) -> Any:
    """The value standing for reduction result ``done`` in a split kernel: the finisher's
    combination of every chunk's partial. This program's partial (``done`` itself, computed
    after the loop) is stored to the workspace, at the next free slots."""
    make = type(done)
    x = frozenset({"x"})
    slot = gen.slots
    gen.slots += len(slot_names(kind, done.name))
    gen.split_partials.append(make(name="", code="\n".join(partial_lines(kind, done.name, done.code, slot)),
                                   deps=list(done.deps), dtype=dtype, dims=x))
    combined = make(name=done.name, code="\n".join(combined_lines(kind, done.name, slot, gen.interpret)),
                    dtype=dtype, dims=x, post=gen.stage)
    if kind == "welford":
        combined.parts = [make(name=f"{done.name}_{p}", code="", deps=[combined], dtype=dtype, dims=x, post=gen.stage)
                          for p in ("mean", "m2", "w")]
    return combined


def place_split_stage(gen: Any, main: list[str], main_seen: set) -> None:
    """Place the statements of the stage ``gen`` just generated. Stage 0's loop runs over this
    program's chunk (grid axis 1) and stores its partial results after the loop; everything
    over the outputs alone goes to the finisher (``gen.finisher``). A later stage may work over
    the outputs only."""
    pre: list[str] = []
    loop: list[str] = []
    loop_seen: set = set()

    def in_kernel(v: Any) -> None:
        seen = loop_seen if v.in_loop() else main_seen
        if v in seen:
            return
        if v.post >= 0:
            raise NotSplittable("a reduction result is needed inside a split reduction's loop")
        for d in v.deps:
            in_kernel(d)
        if v.code:
            (loop if v.in_loop() else pre).extend(v.code.split("\n"))
        seen.add(v)

    def in_finisher(v: Any) -> None:
        if v in gen.finisher_seen:
            return
        if v.in_loop():
            raise NotSplittable("a value of the reduction loop is needed after the loop")
        for d in v.deps:
            in_finisher(d)
        if v.code:
            gen.finisher.extend(v.code.split("\n"))
        gen.finisher_seen.add(v)

    looping = [v for v in gen.roots if v.in_loop()]
    if looping and gen.stage > 0:
        raise NotSplittable("code over the reduction loop after a reduction")
    for v in looping:
        in_kernel(v)
    for v in gen.roots + gen.finals:
        if not v.in_loop():
            in_finisher(v)
    main.extend(pre)
    if loop:
        main.append("for roffset in range(0, rchunk, RBLOCK):")
        rdefs = ["rindex = rstart + roffset + rbase", "rmask = (rindex < rnumel) & (roffset + rbase < rchunk)",
                 "xrmask = xmask & rmask"]
        main.extend("    " + ln for ln in rdefs + gen._var_defs("r", "rindex") + loop)
    for partial in gen.split_partials:
        main.extend(partial.code.split("\n"))
    gen.split_partials = []
