"""Extern calls whose op leaves some results undefined (None): the backward of a CNN's first
convolution needs no input gradient, so ``convolution_backward`` runs with
``output_mask=[False, True, True]`` and its first result is an opaque value nothing uses."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from aten_builder import AtenBuilder  # noqa: E402

from fireclay_loops import from_program, lower, schedule, to_program  # noqa: E402
from fireclay_loops.printer import format_extern  # noqa: E402
from fireclay_loops.reference import run  # noqa: E402


def conv_bn_relu_backward(b: AtenBuilder, x, w, gamma, beta, grad_out, mask):
    """Forward conv -> training batch norm -> relu, then its backward down to the conv."""
    y = b.call("convolution.default", x, w, None, [1, 1], [1, 1], [1, 1], False, [0, 0], 1)
    bn, mean, rstd = b.call("native_batch_norm.default", y, gamma, beta, None, None, True, 0.1, 1e-5)
    r = b.call("relu.default", bn)
    dr = b.call("threshold_backward.default", grad_out, r, 0)
    dy, dgamma, dbeta = b.call("native_batch_norm_backward.default", dr, y, gamma, None, None, mean, rstd,
                               True, 1e-5, [True, True, True])
    dx, dw, db = b.call("convolution_backward.default", dy, x, w, [4], [1, 1], [1, 1], [1, 1], False,
                        [0, 0], 1, mask)
    return [h for h in (dx, dw, db, dgamma, dbeta) if h.meta is not None]


CASES = [
    ([False, True, True], 4),   # first layer: no input gradient
    ([False, True, False], 3),  # no input nor bias gradient: the defined result sits in the middle
    ([True, True, True], 5),    # all defined: the plain layout
]


@pytest.mark.parametrize("fusion", [True, False], ids=["fused", "unfused"])
@pytest.mark.parametrize("mask,n_out", CASES, ids=["no_dx", "only_dw", "all"])
def test_conv_backward_with_undefined_results_matches_eager(mask, n_out, fusion):
    gen = torch.Generator().manual_seed(7 + sum(mask))

    def make():
        return [torch.randn(2, 3, 6, 6, generator=gen), torch.randn(4, 3, 3, 3, generator=gen),
                torch.rand(4, generator=gen) + 0.5, torch.randn(4, generator=gen),
                torch.randn(2, 4, 6, 6, generator=gen)]

    b = AtenBuilder()
    handles = [b.input(t, n) for t, n in zip(make(), ["x", "w", "gamma", "beta", "grad_out"])]
    outs = conv_bn_relu_backward(b, *handles, mask)
    assert len(outs) == n_out
    program = b.output(*outs)
    scheduled = schedule(lower(program), fusion=fusion)
    conv_bwd = [e for e in scheduled.extern_calls if e.op == "aten::convolution_backward.default"]
    assert len(conv_bwd) == 1
    assert conv_bwd[0].result_positions() == [k for k, m in enumerate(mask) if m]
    printed = format_extern(conv_bwd[0]).split(" = ")[0].split(", ")
    assert [p == "_" for p in printed] == [not m for m in mask][:len(printed)]
    for sched in (scheduled, from_program(to_program(scheduled))):  # the dialect keeps the gaps
        fresh = make()
        got = run(sched, *fresh)
        want = b.eager(*fresh)
        assert len(got) == len(want) == n_out
        for gv, wv in zip(got, want):
            assert gv.shape == wv.shape
            torch.testing.assert_close(gv, wv, atol=1e-4, rtol=1e-4)
    back = from_program(to_program(scheduled))
    [again] = [e for e in back.extern_calls if e.op == "aten::convolution_backward.default"]
    assert again.result_positions() == conv_bwd[0].result_positions()


def test_a_used_undefined_result_is_rejected():
    """Only opaque results may be missing; any other non-tensor result of an extern is an error."""
    from fireclay_ir import Graph, Program, ScalarType, TensorMeta
    from fireclay_loops.errors import LoweringError

    g = Graph("main")
    x = g.add_input("x", TensorMeta("float32", (4,)))
    s = g.call("aten::_local_scalar_dense.default", (x,), out=ScalarType("float"))
    g.set_outputs([s])
    with pytest.raises(LoweringError, match="non-tensor"):
        lower(Program.single(g))
