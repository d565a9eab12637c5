"""Which block shape a kernel gets, decided from the index expressions of its memory accesses.

A load or store is *coalesced* when neighbouring lanes touch neighbouring addresses: the
variable laid out along a block's fast axis must have stride 1 in the access. Two cases need
more than the default shapes:

* a **column reduction** (the reduced variable is not contiguous in any access, the outer one
  is: ``x.sum(0)``) keeps its ``[XBLOCK, RBLOCK]`` tile, with configs wide in ``XBLOCK`` so each
  row of the tile is a run of contiguous addresses, and is looped rather than persistent when
  the reduction is long (a persistent tile would be one strided column per program);
* a column reduction with few outer points and a long reduction is **split**: grid axis 1 cuts
  the reduction into chunks, each program writes its partial sums to a float32 workspace, and a
  second small kernel (the *finisher*) adds the partials in a fixed order and stores the results,
  so there are enough programs to fill the GPU and the result does not depend on timing (no
  atomics). Only kernels whose stored results are float32 sums qualify (``NotSplittable``
  otherwise, and the kernel is generated unsplit);
* a **transposing pointwise kernel** (one access contiguous along the last variable, another
  along a different one: ``x.t().contiguous()``, permutes) becomes a 2D tiled kernel: the
  contiguous variable of the other access goes last among the tile's rows (``x`` axis, grid
  axis 0) and the last variable along its columns (``r`` axis, grid axis 1), so both accesses
  read or write whole runs; Triton moves the tile between the two layouts through shared memory.
"""

from __future__ import annotations

import sympy

from fireclay_loops import Kernel, KernelNode

SPLIT_MAX_OUTER = 16384  # split column reductions of at most this many outer points...
SPLIT_MIN_REDUCTION = 4096  # ...and at least this long (and 4x longer than the outer points)
COLUMN_PERSISTENT_LIMIT = 512  # longest column reduction done in one tile of a few columns
MIN_TILED_SIZE = 16  # both tiled variables at least this long, else a flat block does as well
MAX_GRID_Y = 65535  # CUDA's limit on grid axis 1


def unit_stride_var(index, variables: list[sympy.Symbol]) -> sympy.Symbol | None:
    """The variable (innermost first) that moves ``index`` by exactly 1, if any."""
    e = sympy.sympify(index)
    free = e.free_symbols
    for v in reversed(variables):
        if v in free:
            try:
                step = sympy.expand(e.xreplace({v: v + 1}) - e)
            except Exception:  # an index function sympy cannot shift: not provably contiguous
                continue
            if step == 1:
                return v
    return None


def _accesses(kernel: Kernel) -> list:
    return [i for kn in kernel.nodes for b, i, _ in kn.reads() + kn.writes() if b not in kernel.internal]


def reduces_columns(kernel: Kernel) -> bool:
    """True when no access is contiguous along the reduction and some reduced access is along
    the outer points."""
    if not kernel.rsizes or not kernel.xsizes:
        return False
    rlast, xlast = kernel.rvars[-1], kernel.xvars[-1]
    reduced = [i for i in _accesses(kernel) if set(kernel.rvars) & sympy.sympify(i).free_symbols]
    if any(unit_stride_var(i, [rlast]) is not None for i in reduced):
        return False
    return any(unit_stride_var(i, [xlast]) is not None for i in reduced)


def tiled_kernel(kernel: Kernel) -> Kernel | None:
    """The pointwise ``kernel`` as a 2D tiled kernel (rows ``x``, columns ``r``) when its
    accesses are contiguous along different variables; None when a flat block is as good."""
    if kernel.rsizes or kernel.kind != "pointwise" or len(kernel.xsizes) < 2:
        return None
    xvars, sizes = kernel.xvars, kernel.xsizes
    last = xvars[-1]
    units = [unit_stride_var(i, xvars) for i in _accesses(kernel)]
    others = [v for v in units if v is not None and v != last]
    if last not in units or not others:
        return None
    across = others[0]
    k_last, k_across = len(xvars) - 1, xvars.index(across)
    for k in (k_last, k_across):
        if not (sizes[k].is_Integer and int(sizes[k]) >= MIN_TILED_SIZE):
            return None
    if -(-int(sizes[k_last]) // MIN_TILED_SIZE) > MAX_GRID_Y:
        return None
    rows = [k for k in range(len(xvars)) if k not in (k_last, k_across)] + [k_across]
    probe = Kernel("probe", [], [sizes[k] for k in rows], [sizes[k_last]])
    rename = {xvars[k]: probe.xvars[j] for j, k in enumerate(rows)}
    rename[last] = probe.rvars[0]
    nodes = []
    for kn in kernel.nodes:
        var_map = dict(rename)  # a body variable left out of var_map is the kernel variable itself
        var_map.update({s: sympy.sympify(e).xreplace(rename) for s, e in kn.var_map.items()})
        nodes.append(KernelNode(kn.node, var_map, kn.stage))
    return Kernel(kernel.name, nodes, probe.xsizes, probe.rsizes, set(kernel.internal))


class NotSplittable(Exception):
    """The kernel does something a split reduction cannot (another reduction, an epilogue)."""


def should_split(kernel: Kernel) -> bool:
    n, r = kernel.numel, kernel.rnumel
    if not (n.is_Integer and r.is_Integer):
        return False
    return int(n) <= SPLIT_MAX_OUTER and int(r) >= max(SPLIT_MIN_REDUCTION, 4 * int(n))


# A contiguous reduction with this few outer points (a sum to a scalar, a loss) would run on at
# most this many programs, leaving most of a GPU idle while each loops over the whole row: split.
FEW_ROWS = 64
LONG_ROW = 32768


def few_long_rows(kernel: Kernel) -> bool:
    n, r = kernel.numel, kernel.rnumel
    if not kernel.rsizes or not (n.is_Integer and r.is_Integer):
        return False
    return int(n) <= FEW_ROWS and int(r) >= LONG_ROW


def finisher_source(name: str, params: list[str], xdefs: list[str], stores: list[tuple[str, str]],
                    index64: bool) -> str:
    """The kernel that adds a split kernel's partials (``ws[k, split, x]``) and stores result
    ``k`` at the split kernel's own pointer expression ``stores[k]``."""
    prefix = params[: params.index("ws")]
    i64 = ".to(tl.int64)" if index64 else ""
    lines = ["@triton.jit",
             f"def {name}_finish({', '.join(prefix + ['ws', 'nsplit', 'xnumel', 'XBLOCK: tl.constexpr', 'NSPLIT: tl.constexpr'])}):",
             f"    xoffset = tl.program_id(0){i64} * XBLOCK",
             f"    xindex = xoffset + tl.arange(0, XBLOCK)[:, None]{i64}",
             "    xmask = xindex < xnumel",
             f"    zx = tl.zeros([XBLOCK, 1], {'tl.int64' if index64 else 'tl.int32'})",
             "    pindex = tl.arange(0, NSPLIT)[None, :]",
             "    pmask = xmask & (pindex < nsplit)"]
    lines += ["    " + d for d in xdefs]
    for k, (ptr, dtype) in enumerate(stores):
        lines += [f"    part{k} = tl.load(ws + (({k} * nsplit + pindex) * xnumel + xindex), pmask, other=0)",
                  f"    total{k} = tl.sum(part{k}, 1)[:, None]",
                  f"    tl.store({ptr}, total{k}.to({dtype}), xmask)"]
    return "\n".join(lines) + "\n"
