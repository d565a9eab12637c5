"""Library matmuls whose reduction length K or row length N is unaligned get their operands
zero-padded along it (fireclay_loops.lowering.matmul; ``config.pad_matmul``, forced on for the CPU
here): every case runs in the reference executor against eager on fresh inputs, results have
eager's strides, and the library call is handed operands of the padded extents exactly where the
rule says so."""

import pytest

torch = pytest.importorskip("torch")

from aten_builder import AtenBuilder  # noqa: E402

from fireclay_loops import lower, schedule  # noqa: E402
from fireclay_loops.config import config as loops_config  # noqa: E402
from fireclay_loops.reference import run  # noqa: E402

M, N = 256, 260


def plain(b, k, g, dtype):  # [M, K] @ [K, N], both program inputs
    return (b.call("mm.default", b.input(g((M, k), dtype)), b.input(g((k, N), dtype))),)


def transposed_weight(b, k, g, dtype):  # x @ w.t(): the weight stays transposed in its padded copy
    x, w = b.input(g((M, k), dtype)), b.input(g((N, k), dtype))
    return (b.call("mm.default", x, b.call("t.default", w)),)


def computed_operand(b, k, g, dtype):  # the operand is our kernel's result (the logits gradient)
    x, w = b.input(g((M, k), dtype)), b.input(g((k, N), dtype))
    grad = b.call("mul.Tensor", b.call("sub.Tensor", x, 0.5), 2.0)
    # also read by a second matmul over another K (the weight's gradient), unpadded
    return (b.call("mm.default", grad, w), b.call("mm.default", b.call("t.default", grad), grad))


def addmm_bias(b, k, g, dtype):  # addmm whose bias our kernel adds after the padded mm
    x, w, bias = b.input(g((M, k), dtype)), b.input(g((k, N), dtype)), b.input(g((N,), dtype))
    return (b.call("relu.default", b.call("addmm.default", bias, x, w)),)


def logits_returned(b, k, g, dtype):  # the lm_head's forward: [M, 256] @ w.t(), N = k, returned
    h, w = b.input(g((M, 256), dtype)), b.input(g((k, 256), dtype))
    return (b.call("mm.default", h, b.call("t.default", w)),)


def logits_read_by_kernels(b, k, g, dtype):  # N = k, read only by a softmax (padded rows read as a view)
    h, w = b.input(g((M, 256), dtype)), b.input(g((k, 256), dtype))
    logits = b.call("mm.default", h, b.call("t.default", w))
    return (b.call("_softmax.default", logits, 1, False),)


def both_padded(b, k, g, dtype):  # K and N both unaligned
    x, w = b.input(g((M, k), dtype)), b.input(g((k, k), dtype))
    return (b.call("mm.default", x, w),)


CASES = [plain, transposed_weight, computed_operand, addmm_bias]
WIDE = [logits_returned, logits_read_by_kernels, both_padded]
# (K, dtype, padded K or None): float32 aligns to 4 elements, 16-bit types to 8
SHAPES = [(1031, torch.float32, 1032), (1031, torch.bfloat16, 1032), (1029, torch.float16, 1032),
          (1028, torch.float32, None), (1024, torch.bfloat16, None), (1000, torch.float32, None)]


def _build(case, k, dtype, seed=0):
    gen = torch.Generator().manual_seed(seed)
    b = AtenBuilder()
    program = b.output(*case(b, k, lambda shape, dt: torch.randn(shape, generator=gen).to(dt), dtype))
    return b, program


def _mm_reductions(scheduled, position=0):
    """The K each library mm is handed (its first operand's last extent; ``position`` 1: the N,
    its second operand's last extent)."""
    return sorted(int(call.tensor_args()[position].size[-1]) for call in scheduled.extern_calls
                  if "mm" in call.op)


def _check_against_eager(b, scheduled, dtype):
    for seed in (1, 2):
        gen = torch.Generator().manual_seed(seed)
        inputs = [torch.randn(h.meta.shape, generator=gen).to(h.meta.dtype) for h in b.inputs]
        got, want = run(scheduled, *inputs), b.eager(*inputs)
        for g, w in zip(got, want):
            assert g.shape == w.shape and g.stride() == w.stride()
            tol = 2e-3 if dtype == torch.float32 else 0.5
            torch.testing.assert_close(g, w, atol=tol, rtol=2e-2)


@pytest.mark.parametrize("k,dtype,padded", SHAPES, ids=lambda v: str(v))
@pytest.mark.parametrize("case", CASES, ids=lambda c: c.__name__)
def test_padded_matmuls_match_eager(case, k, dtype, padded):
    b, program = _build(case, k, dtype)
    with loops_config.patch(pad_matmul=("cpu",), unfuse_addmm_bias=("cpu",)):
        scheduled = schedule(lower(program))
    ks = _mm_reductions(scheduled)
    assert (padded if padded is not None else k) in ks, (ks, str(scheduled))
    if padded is not None:
        assert k not in ks or case is computed_operand, ks
    _check_against_eager(b, scheduled, dtype)


@pytest.mark.parametrize("k,dtype,padded", SHAPES[:4], ids=lambda v: str(v))
@pytest.mark.parametrize("case", WIDE, ids=lambda c: c.__name__)
def test_padded_rows_of_products_match_eager(case, k, dtype, padded):
    b, program = _build(case, k, dtype)
    with loops_config.patch(pad_matmul=("cpu",)):
        scheduled = schedule(lower(program))
    assert _mm_reductions(scheduled, position=1) == [padded if padded is not None else k], str(scheduled)
    _check_against_eager(b, scheduled, dtype)


@pytest.mark.parametrize("sides", [(M, 64), (64, N)])
def test_thin_products_are_not_padded(sides):
    m, n = sides
    b = AtenBuilder()
    x, w = b.input(torch.randn(m, 1031)), b.input(torch.randn(1031, n))
    program = b.output(b.call("mm.default", x, w))
    with loops_config.patch(pad_matmul=("cpu",)):
        assert _mm_reductions(schedule(lower(program))) == [1031]


def test_padding_is_off_by_default_on_the_cpu():
    b, program = _build(plain, 1031, torch.float32)
    assert _mm_reductions(schedule(lower(program))) == [1031]
