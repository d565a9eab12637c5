"""Fake tensors with static shapes: output metadata equals eager's on real tensors."""

import pytest

torch = pytest.importorskip("torch")

from optable import CASES  # noqa: E402

from fireclay_shapes.torch import FakeMode, FakeTensor, UnsupportedOpError, fake_from_real  # noqa: E402


def flat(out):
    if isinstance(out, (tuple, list)):
        return [t for o in out for t in flat(o)]
    return [out]


def meta_of(t):
    return (tuple(t.shape), t.stride(), t.dtype, t.device, t.storage_offset())


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_static_metadata_matches_eager(case):
    torch.manual_seed(0)
    real_inputs = case.inputs(case.sizes)
    eager = flat(case.fn(*real_inputs))
    mode = FakeMode()
    fakes = [mode.from_real(t) for t in real_inputs]
    with mode:
        out = flat(case.fn(*fakes))
    assert len(out) == len(eager)
    for o, e in zip(out, eager):
        assert isinstance(o, FakeTensor)
        assert meta_of(o) == meta_of(e)


def test_fake_keeps_requires_grad_and_autograd_metadata():
    x = torch.randn(3, 4, requires_grad=True)
    mode = FakeMode()
    fx = mode.from_real(x)
    assert fx.requires_grad and fx.is_leaf
    with mode:
        y = (fx * 2).sum()
    assert y.requires_grad and y.grad_fn is not None
    (eager_y,) = [(x * 2).sum()]
    assert y.shape == eager_y.shape


def test_backward_runs_on_fakes():
    mode = FakeMode()
    w = mode.from_real(torch.randn(4, 5, requires_grad=True))
    x = mode.from_real(torch.randn(3, 4))
    with mode:
        (x @ w).relu().sum().backward()
    assert isinstance(w.grad, FakeTensor) and w.grad.shape == (4, 5)


@pytest.mark.parametrize("device", ["cuda", "cuda:0", "cuda:1"])
def test_factories_report_the_requested_device(device):
    mode = FakeMode()
    with mode:
        t = torch.randn(3, 4, device=device)
        u = (t * 2).sum(0)
        v = torch.zeros_like(t)
        c = t.to("cpu")
    want = torch.device(device) if ":" in device else torch.device("cuda", 0)
    assert t.device == want and u.device == want and v.device == want
    assert t.is_cuda and c.device == torch.device("cpu")
    assert isinstance(t, FakeTensor) and t.shape == (3, 4)


def test_mixing_devices_raises_like_eager():
    mode = FakeMode()
    with mode:
        a = torch.randn(3, 3, device="cuda")
        b = torch.randn(3, 3)
        with pytest.raises(RuntimeError, match="Expected all tensors to be on the same device"):
            a @ b
        with pytest.raises(RuntimeError, match="cuda:0 and cpu"):
            a + b
        assert (a + torch.tensor(2.0)).device.type == "cuda"  # CPU scalars may meet any device


def test_real_tensors_meeting_fakes_become_constants_or_raise():
    real = torch.randn(4)
    mode = FakeMode()
    with mode:
        out = mode.from_real(torch.randn(4)) + real
    assert isinstance(out, FakeTensor)
    strict = FakeMode(allow_real_inputs=False)
    with pytest.raises(Exception, match="real tensor"):
        with strict:
            strict.from_real(torch.randn(4)) + real


def test_in_place_ops_return_the_same_fake():
    mode = FakeMode()
    x = mode.from_real(torch.randn(3, 4))
    with mode:
        assert x.add_(1) is x
        assert x.mul_(torch.randn(4)) is x
    with pytest.raises(UnsupportedOpError, match="in place"):
        with mode:
            x.unsqueeze_(0)


@pytest.fixture(scope="module")
def op_without_meta():
    lib = torch.library.Library("fcshapes_test", "DEF")
    lib.define("opaque(Tensor x) -> Tensor")
    lib.impl("opaque", lambda x: x.clone(), "CPU")
    yield torch.ops.fcshapes_test.opaque.default
    lib._destroy()


def test_op_without_meta_kernel_names_the_op(op_without_meta):
    mode = FakeMode()
    x = mode.from_real(torch.randn(3))
    with pytest.raises(UnsupportedOpError) as err:
        with mode:
            op_without_meta(x)
    msg = str(err.value)
    assert "fcshapes_test.opaque.default" in msg and "no meta kernel" in msg and "register_fake" in msg


def test_fake_from_real_preserves_views_and_offsets():
    base = torch.randn(6, 8)
    view = base[2:, 1::2]
    f = fake_from_real(view)
    assert meta_of(f) == meta_of(view)
    assert repr(f) == "FakeTensor(size=(4, 4), dtype=torch.float32, device=cpu)"


def test_item_and_nonzero_make_data_dependent_sizes():
    from fireclay_shapes import DataDependentError

    mode = FakeMode()
    x = mode.from_real(torch.randn(5, 3))
    with mode:
        nz = x.nonzero()
        n = (x > 0).sum().item()
    assert str(nz.shape[0]) == "u0" and nz.shape[1] == 2
    assert str(n).startswith("u")
    with pytest.raises(DataDependentError, match="data-dependent"):
        bool(nz.shape[0] > 3)
    with pytest.raises(DataDependentError, match="float"):
        with mode:
            x.sum().item()


@pytest.mark.skipif(torch.backends.cuda.is_built(), reason="this torch has CUDA: autograd on CUDA fakes works")
def test_cuda_fakes_refuse_autograd_on_torch_without_cuda():
    mode = FakeMode()
    with pytest.raises(Exception, match="needs a torch built with CUDA"):
        mode.fake([3, 4], device="cuda:0", requires_grad=True)
    with mode:
        t = torch.randn(3, 4, device="cuda")
        with pytest.raises(Exception, match="needs a torch built with CUDA"):
            t.requires_grad_()
        u = torch.randn(3, device="cuda", requires_grad=True)
        with pytest.raises(Exception, match="needs a torch built with CUDA"):
            u * 2
        with torch.no_grad():
            assert (u * 2).device.type == "cuda"  # no autograd, no device guard


def test_a_tracing_mode_above_the_fake_mode_sees_every_op():
    from torch.utils._python_dispatch import TorchDispatchMode

    seen = []

    class Recorder(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            seen.append(str(func))
            return func(*args, **(kwargs or {}))

    mode = FakeMode()
    x = mode.from_real(torch.randn(4, 3))
    with mode, Recorder():
        y = torch.ones(3) + x.relu()
    assert isinstance(y, FakeTensor) and y.shape == (4, 3)
    assert seen == ["aten.ones.default", "aten.relu.default", "aten.add.Tensor"]
