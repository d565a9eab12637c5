"""The cache of op output types: answers from it equal eager's, and it keeps out what it must."""

import pytest

torch = pytest.importorskip("torch")

from optable import CASES  # noqa: E402
from test_fake_static import flat, meta_of  # noqa: E402

from fireclay_shapes.torch import CachedMetaKernels, FakeMode, FakeTensor, _meta_cache  # noqa: E402

aten = torch.ops.aten


@pytest.fixture(autouse=True)
def empty_cache():
    _meta_cache.clear()
    yield
    _meta_cache.clear()


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_cached_answers_equal_eager(case):
    """Each case runs twice in fresh modes: the second run answers from what the first stored,
    and both match eager on real tensors."""
    torch.manual_seed(0)
    real_inputs = case.inputs(case.sizes)
    eager = flat(case.fn(*real_inputs))
    runs = []
    for _ in range(2):
        mode = FakeMode()
        fakes = [mode.from_real(t) for t in real_inputs]
        with mode:
            runs.append(flat(case.fn(*fakes)))
        if len(runs) == 1:
            stored = len(_meta_cache._entries)
    assert len(_meta_cache._entries) == stored  # the second run added nothing: it hit
    for out in runs:
        assert [meta_of(o) for o in out] == [meta_of(e) for e in eager]
        assert all(isinstance(o, FakeTensor) for o in out)


def test_repeated_calls_hit_and_give_fresh_tensors():
    mode = FakeMode()
    x = mode.fake([4, 8], dtype=torch.float32)
    w = mode.fake([8, 16], dtype=torch.float32)
    b = mode.fake([16], dtype=torch.float32)
    first = aten.addmm.default(b, x, w)
    assert len(_meta_cache._entries) == 1
    second = aten.addmm.default(b, x, w)
    assert len(_meta_cache._entries) == 1
    assert second is not first and second.meta is not first.meta
    assert meta_of(second) == meta_of(first) == ((4, 16), (16, 1), torch.float32, torch.device("cpu"), 0)


def test_views_in_place_ops_and_symbolic_calls_are_not_cached():
    assert not _meta_cache.eligible(aten.permute.default)
    assert not _meta_cache.eligible(aten.add_.Tensor)
    assert _meta_cache.eligible(aten.add.Tensor)
    mode = FakeMode()
    x = mode.fake([3, 4])
    y = aten.permute.default(x, [1, 0])
    aten.add_.Tensor(x, 1)
    assert len(_meta_cache._entries) == 0
    assert meta_of(y) == ((4, 3), (1, 4), torch.float32, torch.device("cpu"), 0)
    mode = FakeMode()
    s = mode.from_real(torch.randn(5, 4), dynamic_dims=[0])
    out = aten.mul.Tensor(s, 2)
    assert len(_meta_cache._entries) == 0
    assert out.shape[0] is s.shape[0] or str(out.shape[0]) == str(s.shape[0])


def test_the_default_dtype_is_part_of_the_key():
    ints = FakeMode().from_real(torch.arange(6))
    saved = torch.get_default_dtype()
    try:
        for dtype in (torch.float32, torch.float64, torch.float32):
            torch.set_default_dtype(dtype)
            assert (ints * 1.5).dtype == (torch.arange(6) * 1.5).dtype == dtype
    finally:
        torch.set_default_dtype(saved)


def test_devices_are_part_of_the_key():
    mode = FakeMode()
    a = mode.fake([2, 3], device="cpu")
    b = mode.fake([2, 3], device="cuda:0")
    assert (a + 1).device == torch.device("cpu")
    assert (b + 1).device == torch.device("cuda:0")


def test_plain_meta_tensors_under_the_mode_match_eager_and_keep_autograd_metadata():
    real_x = torch.randn(6, 8, requires_grad=True)
    real_w = torch.randn(8, 8)
    eager = torch.nn.functional.gelu(torch.nn.functional.linear(real_x, real_w)).sum(0)
    x = torch.empty(6, 8, device="meta", requires_grad=True)
    w = torch.empty(8, 8, device="meta")
    for _ in range(2):
        with CachedMetaKernels():
            out = torch.nn.functional.gelu(torch.nn.functional.linear(x, w)).sum(0)
        assert (tuple(out.shape), out.stride(), out.dtype) == (tuple(eager.shape), eager.stride(), eager.dtype)
        assert out.requires_grad and not out.is_leaf and out.grad_fn is not None
    assert len(_meta_cache._entries) > 0


def test_a_kernel_error_is_raised_every_time():
    for _ in range(2):
        with CachedMetaKernels(), pytest.raises(RuntimeError):
            torch.mm(torch.empty(2, 3, device="meta"), torch.empty(4, 5, device="meta"))


@pytest.mark.parametrize("order", [("contiguous", "transposed"), ("transposed", "contiguous")])
def test_calls_differing_only_in_strides_or_dtype_get_their_own_answers(order):
    reals = {"contiguous": torch.randn(4, 6), "transposed": torch.randn(6, 4).t(),
             "double": torch.randn(4, 6, dtype=torch.float64)}
    mode = FakeMode()
    for name in order + ("double",) + order:
        x = mode.from_real(reals[name])
        assert meta_of(torch.exp(x)) == meta_of(torch.exp(reals[name]))


@pytest.mark.parametrize("index", [-1, -2, 1])
@pytest.mark.parametrize("op", [aten.sub.Tensor, aten.mul.Tensor, aten.add.Tensor])
def test_elements_of_a_symbolic_length_are_not_keyed(index, op):
    """``pos[-1]`` of a tensor of symbolic length is 0-d with static sizes and strides, but its
    storage offset is symbolic (s0 - 1): the call is computed, not keyed (hashing the offset
    raised, and capture ran the whole frame eagerly)."""
    from fireclay_shapes import ShapeEnv

    mode = FakeMode(ShapeEnv.restore([{"name": "s0", "hint": 8, "min": 3, "max": None}], []))
    pos = mode.fake(["s0"], dtype=torch.int64)
    with mode:
        a, b = pos[0], pos[index]
        out = op(a, b)
    assert out.shape == () and out.dtype == torch.int64
    assert isinstance(out, FakeTensor)
