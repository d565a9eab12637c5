"""``addmm`` on CUDA: ``mm`` plus a bias our kernels fuse, when only our kernels read the result
(fireclay_loops.lowering.matmul); an extern ``addmm`` otherwise."""

import pytest
from hand import Hand

from fireclay_ir import TensorMeta
from fireclay_loops import ExternNode, lower, schedule


def t(*shape, device="cuda"):
    return TensorMeta("float32", tuple(shape), device=device)


def _program(consumer: str, device: str = "cuda", bias_shape=(16,)):
    h = Hand()
    g = h.graph
    b = g.add_input("b", t(*bias_shape, device=device))
    x = g.add_input("x", t(8, 32, device=device))
    w = g.add_input("w", t(32, 16, device=device))
    y = h.op("addmm.default", b, x, w, out=t(8, 16, device=device))
    if consumer == "gelu":
        out = h.op("gelu.default", y, out=t(8, 16, device=device))
    elif consumer == "view_add":
        v = h.op("view.default", y, [2, 4, 16], out=t(2, 4, 16, device=device))
        out = h.op("add.Tensor", v, v, out=t(2, 4, 16, device=device))
    elif consumer == "mm":
        w2 = g.add_input("w2", t(16, 4, device=device))
        out = h.op("mm.default", y, w2, out=t(8, 4, device=device))
    else:  # the addmm's result is the program's output
        out = y
    return h.program(out)


def _externs(program) -> list[str]:
    return [s.op for s in schedule(lower(program)).steps if isinstance(s, ExternNode)]


@pytest.mark.parametrize("consumer", ["gelu", "view_add"])
def test_bias_joins_the_kernel_that_reads_the_product(consumer):
    s = schedule(lower(_program(consumer)))
    assert [e.op for e in s.steps if isinstance(e, ExternNode)] == ["aten::mm.default"]
    assert len(s.kernels) == 1  # the bias add, fused with its reader
    assert any(b == "in_b" for kn in s.kernels[0].nodes for b, _, _ in kn.reads())


@pytest.mark.parametrize("consumer,device,bias_shape", [
    ("mm", "cuda", (16,)),      # a library call reads it: the epilogue is free there
    ("output", "cuda", (16,)),  # the program returns it: the add would be a pass of its own
    ("gelu", "cuda", (8, 16)),  # a full bias: no broadcast to fuse
    ("gelu", "cpu", (16,)),     # not a device it is on for by default
])
def test_addmm_stays_one_library_call(consumer, device, bias_shape):
    assert "aten::addmm.default" in _externs(_program(consumer, device, bias_shape))


def test_every_pure_view_target_is_lowered_as_a_view():
    """The view ops the addmm rule looks through are the ones views.py lowers (no drift)."""
    from fireclay_loops.lowering.driver import lowering_for
    from fireclay_loops.lowering.views import PURE_VIEW_TARGETS

    for target in PURE_VIEW_TARGETS:
        fn = lowering_for(target)
        assert fn is not None and fn.__module__ == "fireclay_loops.lowering.views", target
