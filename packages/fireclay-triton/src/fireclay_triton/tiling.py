"""Which block shape a kernel gets, decided from the index expressions of its memory accesses.

A load or store is *coalesced* when neighbouring lanes touch neighbouring addresses: the
variable laid out along a block's fast axis must have stride 1 in the access. Two cases need
more than the default shapes:

* a **column reduction** (the reduced variable is not contiguous in any access, the outer one
  is: ``x.sum(0)``) keeps its ``[XBLOCK, RBLOCK]`` tile, with configs wide in ``XBLOCK`` so each
  row of the tile is a run of contiguous addresses, and is looped rather than persistent when
  the reduction is long (a persistent tile would be one strided column per program);
* a column reduction with few outer points and a long reduction, and any reduction with very
  few outputs and a long one, is **split**: grid axis 1 cuts the reduction into chunks, each
  program writes its partial results to a float32 workspace, and a second small kernel (the
  *finisher*) combines them in a fixed order and runs what follows over the outputs, so there
  are enough programs to fill the GPU and the result does not depend on timing (no atomics).
  The shapes are :func:`fireclay_loops.long_reductions.few_outputs`' (the scheduler keeps
  those kernels splittable); the text is :mod:`fireclay_triton.split_reduction`'s. A kernel
  the split cannot do (``NotSplittable``: code over the reduction loop after a reduction, a
  reduction other than a float32 sum, max, min or Welford) is generated unsplit;
* a **transposing pointwise kernel** (one access contiguous along the last variable, another
  along a different one: ``x.t().contiguous()``, permutes) becomes a 2D tiled kernel: the
  contiguous variable of the other access goes last among the tile's rows (``x`` axis, grid
  axis 0) and the last variable along its columns (``r`` axis, grid axis 1), so both accesses
  read or write whole runs; Triton moves the tile between the two layouts through shared memory.
"""

from __future__ import annotations

import sympy

from fireclay_loops import Kernel, KernelNode
from fireclay_loops.long_reductions import few_outputs
from fireclay_loops.long_reductions import reduces_columns as _reduces_columns
from fireclay_loops.long_reductions import unit_stride_var as unit_stride_var  # re-exported

COLUMN_PERSISTENT_LIMIT = 512  # longest column reduction done in one tile of a few columns
MIN_TILED_SIZE = 16  # both tiled variables at least this long, else a flat block does as well
MAX_GRID_Y = 65535  # CUDA's limit on grid axis 1


def _accesses(kernel: Kernel) -> list:
    return [i for kn in kernel.nodes for b, i, _ in kn.reads() + kn.writes() if b not in kernel.internal]


def reduces_columns(kernel: Kernel) -> bool:
    """True when no access is contiguous along the reduction and some reduced access is along
    the outer points."""
    return _reduces_columns(_accesses(kernel), kernel.xvars, kernel.rvars)


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
    """The kernel does something a split reduction cannot (code over the loop after a reduction,
    a reduction whose partial results do not combine)."""


def should_split(kernel: Kernel) -> bool:
    """A column reduction of this shape is split (when it reduces columns)."""
    return few_outputs(kernel.numel, kernel.rnumel, columns=True)


def few_long_rows(kernel: Kernel) -> bool:
    """A reduction with so few outputs that one program per row would leave most of a GPU idle
    while each loops over its whole row (a sum to a scalar, a loss): split whatever its layout."""
    return bool(kernel.rsizes) and few_outputs(kernel.numel, kernel.rnumel, columns=False)
