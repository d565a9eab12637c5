"""View lowerings: every view is index arithmetic over its base, never a copy.

Strided views of a buffer stay :class:`BufferValue` (new strides and offset); views strides
cannot express (reshaping a permuted tensor, flip, repeat) read their base through an index map
with ``FloorDiv`` / ``Mod``.
"""

from __future__ import annotations

import sympy

from fireclay_loops import exprs
from fireclay_loops.lowering.registry import register_lowering
from fireclay_loops.lowering.values import BufferValue, permuted, view

# The ops lowered here that neither compute nor copy (flip and repeat read through an index map
# and count as computing): other lowerings look through them to the ops that read their results.
PURE_VIEW_TARGETS = frozenset({
    "view.default", "_unsafe_view.default", "reshape.default", "alias.default", "detach.default",
    "permute.default", "transpose.int", "t.default", "expand.default", "slice.Tensor", "narrow.default",
    "split.Tensor", "split_with_sizes.default", "unbind.int", "select.int", "unsqueeze.default",
    "squeeze.dim", "squeeze.dims", "squeeze.default", "as_strided.default", "diagonal.default",
})


def _norm(dim: int, rank: int) -> int:
    return dim % rank if rank else 0


def view_strides(size, strides, new_size) -> list[int] | None:
    """Strides that show a tensor of static ``size`` and ``strides`` as ``new_size`` without
    moving data, when some do: each run of dims that are contiguous with one another may be
    split or merged (a head split of the q slice of a fused qkv projection). None otherwise."""
    size, strides, new_size = ([exprs.to_static(d) for d in ds] for ds in (size, strides, new_size))
    if None in size or None in strides or None in new_size or 0 in size or not size:
        return None
    out = [0] * len(new_size)
    d = len(new_size) - 1
    base, numel, view_numel = strides[-1], 1, 1
    for k in range(len(size) - 1, -1, -1):
        numel *= size[k]
        # The end of a run: the next outer dim does not continue it.
        if k == 0 or (size[k - 1] != 1 and strides[k - 1] != numel * base):
            while d >= 0 and (view_numel < numel or new_size[d] == 1):
                out[d] = view_numel * base
                view_numel *= new_size[d]
                d -= 1
            if view_numel != numel:
                return None
            if k > 0:
                base, numel, view_numel = strides[k - 1], 1, 1
    return out if d == -1 else None


def _reshape(ctx, x, size):
    if isinstance(x, BufferValue) and x.is_contiguous():
        return BufferValue(x.buffer, size, exprs.contiguous_strides(size), x.offset)
    if isinstance(x, BufferValue):
        strides = view_strides(x.size, x.stride, size)
        if strides is not None:
            return BufferValue(x.buffer, size, strides, x.offset)
    groups = reshape_groups(x.size, size)
    if groups is not None:
        return view(x, size, lambda idx: _grouped_index(idx, x.size, size, groups))
    new_strides = exprs.contiguous_strides(size)
    old_strides = exprs.contiguous_strides(x.size)

    def index_map(idx):
        flat = sum((i * s for i, s in zip(idx, new_strides)), sympy.Integer(0))
        return [exprs.modular_indexing(flat, st, n) for st, n in zip(old_strides, x.size)]

    return view(x, size, index_map)


def reshape_groups(size, new_size) -> list[tuple[list[int], list[int]]] | None:
    """The dims of a static reshape in the smallest groups of equal element count, as
    ``(old dims, new dims)`` pairs (merging ``[4, 64, 384]`` into ``[256, 384]`` is ``([0, 1],
    [0])``, ``([2], [1])``); None for symbolic or empty shapes. Indexing group by group keeps
    each dim's index a function of its own group's indices: no flat index over the whole
    tensor, whose divisions no kernel can hoist or vectorise."""
    static_old, static_new = [exprs.to_static(d) for d in size], [exprs.to_static(d) for d in new_size]
    old = [n for n in static_old if n is not None]
    new = [n for n in static_new if n is not None]
    if len(old) != len(static_old) or len(new) != len(static_new) or 0 in old or 0 in new:
        return None
    groups, i, j = [], 0, 0
    while i < len(old) or j < len(new):
        dims_old: list[int] = []
        dims_new: list[int] = []
        n_old, n_new = 1, 1
        while not (dims_old or dims_new) or n_old != n_new:
            if (n_old <= n_new and i < len(old)) or j == len(new):
                if i == len(old):
                    return None  # (element counts differ: not a reshape)
                n_old *= old[i]
                dims_old.append(i)
                i += 1
            else:
                n_new *= new[j]
                dims_new.append(j)
                j += 1
        groups.append((dims_old, dims_new))
    return groups


def _grouped_index(idx, size, new_size, groups):
    old_index = [sympy.Integer(0)] * len(size)
    for dims_old, dims_new in groups:
        flat, step = sympy.Integer(0), sympy.Integer(1)
        for j in reversed(dims_new):
            flat, step = flat + idx[j] * step, step * new_size[j]
        step = sympy.Integer(1)
        for k, i in enumerate(reversed(dims_old)):
            digit = exprs.FloorDiv(flat, step) if step != 1 else flat
            # (the outermost digit of a group needs no remainder: the group's index is below it)
            old_index[i] = digit if k == len(dims_old) - 1 else exprs.Mod(digit, size[i])
            step = step * size[i]
    return old_index


@register_lowering("view.default", "_unsafe_view.default", "reshape.default")
def lower_view(ctx, x, size):
    return _reshape(ctx, x, ctx.out_meta()[0])


@register_lowering("alias.default", "detach.default", "lift_fresh.default")
def lower_alias(ctx, x):
    return x


@register_lowering("permute.default")
def lower_permute(ctx, x, dims):
    return permuted(x, [_norm(d, x.rank) for d in dims])


@register_lowering("transpose.int")
def lower_transpose(ctx, x, dim0, dim1):
    perm = list(range(x.rank))
    if x.rank:
        a, b = _norm(dim0, x.rank), _norm(dim1, x.rank)
        perm[a], perm[b] = perm[b], perm[a]
    return lower_permute(ctx, x, perm)


@register_lowering("t.default")
def lower_t(ctx, x):
    return lower_permute(ctx, x, list(reversed(range(x.rank))))


@register_lowering("expand.default")
def lower_expand(ctx, x, size, implicit=False):
    out = ctx.out_meta()[0]
    lead = len(out) - x.rank

    def index_map(idx):
        return [sympy.Integer(0) if exprs.equal(x.size[k], 1) else idx[lead + k] for k in range(x.rank)]

    return view(x, out, index_map)


def _slice(x, dim, start, end, step):
    n = x.size[dim]
    start = 0 if start is None else start
    if exprs.to_static(start) is not None:
        start = exprs.to_static(start)
    static_n = exprs.to_static(n)
    if isinstance(start, int) and static_n is not None:
        # (clamped as Python clamps: `x[-512:]` of 8 rows starts at row 0)
        start = max(0, min(start + static_n if start < 0 else start, static_n))
    elif isinstance(start, int) and start < 0:
        start = start + n
    size = list(x.size)

    def index_map(idx):
        old = list(idx)
        old[dim] = exprs.as_expr(start) + idx[dim] * step
        return old

    return size, index_map


@register_lowering("slice.Tensor")
def lower_slice(ctx, x, dim=0, start=None, end=None, step=1):
    dim = _norm(dim, x.rank)
    _, index_map = _slice(x, dim, start, end, step)
    return view(x, ctx.out_meta()[0], index_map)


@register_lowering("narrow.default")
def lower_narrow(ctx, x, dim, start, length):
    dim = _norm(dim, x.rank)
    _, index_map = _slice(x, dim, start, None, 1)
    return view(x, ctx.out_meta()[0], index_map)


@register_lowering("split.Tensor", "split_with_sizes.default")
def lower_split(ctx, x, split, dim=0):
    dim = _norm(dim, x.rank)
    outs, start = [], sympy.Integer(0)
    for k in range(len(ctx.node.outputs)):
        size = ctx.out_meta(k)[0]
        _, index_map = _slice(x, dim, start, None, 1)
        outs.append(view(x, size, index_map))
        start = start + size[dim]
    return tuple(outs)


@register_lowering("unbind.int")
def lower_unbind(ctx, x, dim=0):
    dim = _norm(dim, x.rank)
    return tuple(_select(x, dim, k) for k in range(len(ctx.node.outputs)))


def _select(x, dim, index):
    if isinstance(index, int) and index < 0:
        index = index + x.size[dim]
    size = x.size[:dim] + x.size[dim + 1:]

    def index_map(idx):
        return list(idx[:dim]) + [exprs.as_expr(index)] + list(idx[dim:])

    return view(x, size, index_map)


@register_lowering("select.int")
def lower_select(ctx, x, dim, index):
    return _select(x, _norm(dim, x.rank), index)


@register_lowering("unsqueeze.default")
def lower_unsqueeze(ctx, x, dim):
    dim = dim % (x.rank + 1)
    size = x.size[:dim] + [sympy.Integer(1)] + x.size[dim:]
    return view(x, size, lambda idx: list(idx[:dim]) + list(idx[dim + 1:]))


@register_lowering("squeeze.dim", "squeeze.dims", "squeeze.default")
def lower_squeeze(ctx, x, dim=None):
    if dim is None:
        dims = list(range(x.rank))
    else:
        dims = [_norm(d, x.rank) for d in (dim if isinstance(dim, (list, tuple)) else [dim])]
    drop = [k for k in dims if exprs.equal(x.size[k], 1)]
    keep = [k for k in range(x.rank) if k not in drop]

    def index_map(idx):
        old = [sympy.Integer(0)] * x.rank
        for j, k in enumerate(keep):
            old[k] = idx[j]
        return old

    return view(x, [x.size[k] for k in keep], index_map)


@register_lowering("as_strided.default")
def lower_as_strided(ctx, x, size, stride, storage_offset=None):
    base = ctx.realize(x)
    offset = base.offset if storage_offset is None else storage_offset
    return BufferValue(base.buffer, size, stride, offset)


@register_lowering("unfold.default")
def lower_unfold(ctx, x, dimension, size, step):
    """Windows of ``size`` every ``step`` along ``dimension``, as a new last dimension: a view,
    read at ``window * step + offset`` (a library call would return a view of a buffer whose
    memory the plan reuses)."""
    if x.rank == 0:
        from fireclay_loops.lowering.context import fallback

        return fallback(ctx)
    d = _norm(dimension, x.rank)
    out = ctx.out_meta()[0]

    def index_map(idx):
        old = list(idx[:x.rank])
        old[d] = idx[d] * step + idx[x.rank]
        return old

    return view(x, out, index_map)


@register_lowering("diagonal.default")
def lower_diagonal(ctx, x, offset=0, dim1=0, dim2=1):
    d1, d2 = _norm(dim1, x.rank), _norm(dim2, x.rank)
    rest = [k for k in range(x.rank) if k not in (d1, d2)]

    def index_map(idx):
        old = [None] * x.rank
        for j, k in enumerate(rest):
            old[k] = idx[j]
        old[d1] = idx[-1] + max(-offset, 0)
        old[d2] = idx[-1] + max(offset, 0)
        return old

    return view(x, ctx.out_meta()[0], index_map)


@register_lowering("flip.default")
def lower_flip(ctx, x, dims):
    dims = {_norm(d, x.rank) for d in dims}

    def index_map(idx):
        return [x.size[k] - 1 - i if k in dims else i for k, i in enumerate(idx)]

    return view(x, x.size, index_map)


@register_lowering("repeat.default")
def lower_repeat(ctx, x, repeats):
    out = ctx.out_meta()[0]
    lead = len(out) - x.rank

    def index_map(idx):
        return [exprs.Mod(idx[lead + k], x.size[k]) for k in range(x.rank)]

    return view(x, out, index_map)


# --------------------------------------------------------------------------- sizes as values


@register_lowering("sym_size.int")
def lower_sym_size(ctx, x, dim):
    return x.size[_norm(dim, x.rank)]


@register_lowering("sym_numel.default")
def lower_sym_numel(ctx, x):
    return exprs.product(x.size)
