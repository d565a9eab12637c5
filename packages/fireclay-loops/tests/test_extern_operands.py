"""Operands of extern calls are strided views of what is already in memory, never a copy made
only to change the layout: a head split of a fused projection stays a view of it, and a value
computed for one matmul is read transposed by the next instead of being computed again.
Every program also runs against eager."""

import itertools
import re

import pytest

torch = pytest.importorskip("torch")

from aten_builder import AtenBuilder  # noqa: E402

from fireclay_loops import lower, schedule  # noqa: E402
from fireclay_loops.lowering.views import view_strides  # noqa: E402
from fireclay_loops.reference import run  # noqa: E402


def _heads_of_fused_qkv(b, g):
    """The q, k, v slices of one projection, split into heads: strided views, no kernel."""
    x, w = b.input(g((2, 5, 8))), b.input(g((24, 8)))
    qkv = b.call("view.default", b.call("mm.default", b.call("view.default", x, [10, 8]),
                                         b.call("t.default", w)), [2, 5, 24])
    q, k, v = b.call("split_with_sizes.default", qkv, [8, 8, 8], -1)
    q, k, v = (b.call("permute.default", b.call("view.default", t, [2, 5, 2, 4]), [0, 2, 1, 3]) for t in (q, k, v))
    out, _ = b.call("_scaled_dot_product_flash_attention_for_cpu.default", q, k, v, 0.0, True)
    return (out,)


def _cat_for_two_matmuls(b, g):
    """A weight gradient and an input gradient from one concatenated gradient: the cat is
    computed once, the second matmul reads it transposed."""
    d1, d2, x, w = b.input(g((6, 4))), b.input(g((6, 3))), b.input(g((6, 5))), b.input(g((5, 7)))
    cat = b.call("cat.default", [b.call("exp.default", d1), d2], 1)
    dx = b.call("mm.default", cat, b.call("t.default", w))
    dw = b.call("mm.default", b.call("t.default", cat), x)
    return dx, dw


# (builder, buffers that kernels write: what the program computes besides the extern calls)
CASES = [(_heads_of_fused_qkv, 0), (_cat_for_two_matmuls, 1)]


@pytest.mark.parametrize("build,written", CASES, ids=[c[0].__name__ for c in CASES])
def test_extern_operands_are_views_of_memory(build, written):
    gen = torch.Generator().manual_seed(7)
    b = AtenBuilder()
    program = b.output(*build(b, lambda shape: torch.randn(shape, generator=gen)))
    scheduled = schedule(lower(program))
    computed = {b for k in scheduled.kernels for b in k.write_buffers()}
    assert len(computed) == written, str(scheduled)
    fresh = [torch.randn(h.meta.shape, generator=gen) for h in b.inputs]
    for got, want in zip(run(scheduled, *fresh), b.eager(*fresh)):
        torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)


def _layouts():
    """(shape, strides) of permuted, sliced and expanded tensors."""
    for shape in [(4, 6), (2, 3, 4), (2, 1, 3, 4), (3, 8, 2)]:
        base = torch.empty(shape)
        for perm in itertools.permutations(range(len(shape))):
            t = base.permute(*perm)
            yield t
            if t.shape[-1] > 1:
                yield t[..., 1:]
            yield t.unsqueeze(1).expand(*t.shape[:1], 2, *t.shape[1:])


def _reshapes(numel: int):
    """Target shapes of ``numel`` elements: splits and merges, with and without unit dims."""
    out = [[numel], [1, numel], [numel, 1]]
    for a in range(2, numel):
        if numel % a == 0:
            out += [[a, numel // a], [numel // a, 1, a]]
            rest = numel // a
            for c in range(2, rest):
                if rest % c == 0:
                    out.append([a, c, rest // c])
    return out


def test_view_strides_agree_with_torch():
    checked = viewable = 0
    for t in _layouts():
        for shape in _reshapes(t.numel()):
            try:
                want = t.view(shape).stride()
            except RuntimeError:
                want = None
            got = view_strides(list(t.shape), list(t.stride()), shape)
            checked += 1
            if want is None:
                assert got is None, (tuple(t.shape), t.stride(), shape, got)
            else:
                viewable += 1
                assert got is not None, (tuple(t.shape), t.stride(), shape)
                assert all(n <= 1 or a == b for n, a, b in zip(shape, got, want)), (t.stride(), shape, got, want)
    assert viewable > 100 and checked - viewable > 100  # both kinds are exercised


# (shape, reshaped to): merges, splits, both, and extent-1 dims
RESHAPES = [((4, 6, 8), (24, 8)), ((4, 6, 8), (4, 48)), ((24, 8), (4, 6, 8)), ((4, 6), (3, 8)),
            ((2, 1, 6), (12,)), ((12,), (2, 1, 6, 1)), ((3, 4, 5), (5, 12)), ((2, 3, 4, 5), (6, 20))]


@pytest.mark.parametrize("shape,new_shape", RESHAPES, ids=[f"{a}->{b}" for a, b in RESHAPES])
def test_reshapes_of_computed_values_match_eager(shape, new_shape):
    """A reshape of a value that is not a strided buffer (a concatenation) reads it through an
    index map; each reshaped group of dims is indexed on its own."""
    gen = torch.Generator().manual_seed(3)
    a, b = torch.randn(*shape[:-1], 1, generator=gen), torch.randn(*shape[:-1], shape[-1] - 1, generator=gen)
    builder = AtenBuilder()
    cat = builder.call("cat.default", [builder.input(a, "a"), builder.input(b, "b")], -1)
    program = builder.output(builder.call("exp.default", builder.call("view.default", cat, list(new_shape))))
    scheduled = schedule(lower(program))
    for got, want in zip(run(scheduled, a, b), builder.eager(a, b)):
        torch.testing.assert_close(got, want)


def test_merged_dims_are_indexed_without_a_flat_index():
    """``[4, 64, 8] -> [256, 8]`` reads dims 0 and 1 as ``r // 64`` and ``r % 64`` of the merged
    index alone: no division of an index that mixes in the other dim (which a kernel can neither
    hoist out of its inner loop nor vectorise)."""
    builder = AtenBuilder()
    a, b = torch.randn(4, 64, 3), torch.randn(4, 64, 5)
    cat = builder.call("cat.default", [builder.input(a, "a"), builder.input(b, "b")], -1)
    merged = builder.call("view.default", cat, [256, 8])
    program = builder.output(builder.call("sum.dim_IntList", merged, [0]))
    text = str(schedule(lower(program)))
    divisions = re.findall(r"FloorDiv\(([^,]+),", text)
    assert all("+" not in d for d in divisions), text  # none at all once the digits fold back
    for got, want in zip(run(schedule(lower(program)), a, b), builder.eager(a, b)):
        torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)


def _pooled_heads(b, x):
    """Hiera's pooled query: a 2x2 max-pool of an NCHW view of channels-last memory, moved back
    to channels-last and split into heads. Eager's pool keeps the input's channels-last layout,
    so the heads it hands attention have a dense last dimension; a pool stored NCHW does not."""
    pooled, _ = b.call("max_pool2d_with_indices.default", x, [2, 2], [2, 2])
    pixels = b.call("view.default", b.call("permute.default", pooled, [0, 2, 3, 1]), [2, 4, 2, 4])
    return b.call("permute.default", pixels, [0, 2, 1, 3])


def _attention_on_pooled_heads(b, x, k, v):
    out, _ = b.call("_scaled_dot_product_flash_attention_for_cpu.default", _pooled_heads(b, x), k, v, scale=0.3)
    return (out,)


def _attention_backward_on_pooled_heads(b, x, k, v):
    q, k, v = _pooled_heads(b, x), _pooled_heads(b, k), _pooled_heads(b, v)
    out, lse = b.call("_scaled_dot_product_flash_attention_for_cpu.default", q, k, v, scale=0.3)
    grad_out = b.call("exp.default", out)
    return b.call("_scaled_dot_product_flash_attention_for_cpu_backward.default", grad_out, q, k, v, out, lse,
                  0.0, False, scale=0.3)


# (builder, its inputs' shapes: channels-last 4-D activations, contiguous head tensors)
ATTENTION_CASES = [(_attention_on_pooled_heads, [(2, 8, 4, 4), (2, 2, 6, 4), (2, 2, 6, 4)]),
                   (_attention_backward_on_pooled_heads, [(2, 8, 4, 4)] * 3)]


@pytest.mark.parametrize("fusion", [True, False], ids=["fused", "unfused"])
@pytest.mark.parametrize("build,shapes", ATTENTION_CASES, ids=[c[0].__name__ for c in ATTENTION_CASES])
def test_fused_attention_reads_a_dense_last_dimension(build, shapes, fusion):
    """The fused attention kernels (forward and backward) read query, key, value and output as
    if their last dimension were dense, without checking: an operand whose buffer lowering laid
    out otherwise is copied first (it returned wrong values with no error, SAM2's vision model)."""
    gen = torch.Generator().manual_seed(11)

    def make(shape):
        t = torch.randn(shape, generator=gen)
        return t.contiguous(memory_format=torch.channels_last) if shape[1] == 8 else t

    builder = AtenBuilder()
    program = builder.output(*build(builder, *(builder.input(make(s)) for s in shapes)))
    scheduled = schedule(lower(program), fusion=fusion)
    for step in scheduled.extern_calls:
        for a in step.args:
            if hasattr(a, "stride") and len(a.size) > 1:
                assert a.stride[-1] == 1 or a.size[-1] == 1, str(scheduled)
    fresh = [make(s) for s in shapes]
    got, want = run(scheduled, *fresh), builder.eager(*fresh)
    assert len(got) == len(want)
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w, atol=1e-5, rtol=1e-5)


def _bias_operand(program):
    from fireclay_loops.ir import ExternNode

    lowered = lower(program)
    calls = [n for n in lowered.nodes if isinstance(n, ExternNode) and "attention" in n.op]
    assert len(calls) == 1
    op = calls[0].op.split("::")[-1]
    from fireclay_loops.lowering.extern import BIAS_POSITIONS

    return calls[0].args[BIAS_POSITIONS[op]]


@pytest.mark.parametrize("keys", [7, 16, 30])
@pytest.mark.parametrize("op", ["_scaled_dot_product_efficient_attention.default"])
@pytest.mark.parametrize("bias_shape", [(2, 3, 5, None), (2, 1, 5, None), (1, 1, 5, None)])
def test_attention_masks_reach_the_kernel_aligned(op, keys, bias_shape):
    """A computed mask (here a scaled input) is stored in rows padded to 16 elements, as eager's
    scaled_dot_product_attention pads it: the kernels refuse a mask whose batch, head or query
    stride is not a multiple of 16 bytes (a relative-position bias of 197 keys raised
    "attn_bias is not correctly aligned (strideB)" on CUDA)."""
    b = AtenBuilder()
    q = b.input(torch.randn(2, 3, 5, 8))
    k = b.input(torch.randn(2, 3, keys, 8))
    v = b.input(torch.randn(2, 3, keys, 8))
    shape = [n if n is not None else keys for n in bias_shape]
    bias = b.call("mul.Tensor", b.input(torch.randn(shape)), 0.5)
    bias = b.call("expand.default", bias, [2, 3, 5, keys])
    results = b.call(op, q, k, v, bias, False)
    arg = _bias_operand(b.output(results[0]))
    strides = [s for n, s in zip(arg.size[:-1], arg.stride[:-1]) if int(n) != 1]
    assert all(int(s) % 16 == 0 for s in strides), (arg.size, arg.stride)
    assert int(arg.offset) % 16 == 0 and int(arg.stride[-1]) == 1


def test_one_aligned_mask_serves_every_attention_call():
    """A computed mask read by several attention calls (one per layer) is stored aligned once."""
    from fireclay_loops.ir import ExternNode
    from fireclay_loops.lowering.extern import BIAS_POSITIONS

    op = "_scaled_dot_product_efficient_attention.default"
    b = AtenBuilder()
    q = b.input(torch.randn(2, 3, 5, 8))
    kv = b.input(torch.randn(2, 3, 7, 8))
    bias = b.call("expand.default", b.call("mul.Tensor", b.input(torch.randn(2, 1, 1, 7)), 0.5), [2, 3, 5, 7])
    first = b.call(op, q, kv, kv, bias, False)
    second = b.call(op, first[0], kv, kv, bias, False)
    lowered = lower(b.output(second[0]))
    calls = [n for n in lowered.nodes if isinstance(n, ExternNode) and "attention" in n.op]
    assert len(calls) == 2
    masks = {calls[i].args[BIAS_POSITIONS[op]].buffer for i in range(2)}
    assert len(masks) == 1, masks
