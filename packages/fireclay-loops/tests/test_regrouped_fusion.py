"""A group fused across a view (its loops joined into one flat loop) and then fused again onto
loops shaped differently: its variable maps compose a digit of the flat loop with the flat loop
written in the new ones (``FloorDiv(x0, 96)`` after ``x0 -> 96*x0 + 12*x1 + x2``), which only
the new loops' ranges fold back. Unfolded, a node of the group read a buffer of the group at an
index the verifier could not prove equal to where it was written, and the whole graph fell back
to the interpreter (a flat ``torch.roll`` next to a layer norm of a cat on the last dimension)."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from aten_builder import AtenBuilder  # noqa: E402

from fireclay_loops import exprs, lower, schedule  # noqa: E402
from fireclay_loops.reference import run  # noqa: E402

CPU = torch.device("cpu")


def _rolled(b, x, shift, dim):
    n = x.meta.shape[dim]
    idx = b.call("fmod.Scalar", b.call("add.Tensor", b.call("arange.start_step", 0, n, device=CPU), shift), n)
    return b.call("index_select.default", x, dim, idx)


def _layer_norm_of_cat_and_flat_roll(shape, roll_first):
    # torch.roll(x, (-3, 5), (1, 2)) * w, every other row concatenated on the last dim and
    # layer-normed; beside it torch.roll(x, 2) (a roll of the flattened x, viewed back)
    n, h, w = shape
    b = AtenBuilder()
    x, weight = b.input(torch.randn(shape), "x"), b.input(torch.randn(w), "w")
    y = _rolled(b, _rolled(b, x, 3, 1), w - 5, 2) if roll_first else x
    y = b.call("mul.Tensor", y, weight)
    z = b.call("cat.default", [b.call("slice.Tensor", y, 1, k, h, 2) for k in (0, 1)], -1)
    normed = b.call("native_layer_norm.default", z, [2 * w], None, None, 1e-5)[0]
    flat = _rolled(b, b.call("view.default", x, [n * h * w]), n * h * w - 2, 0)
    return b, b.output(normed, b.call("view.default", flat, list(shape)))


@pytest.mark.parametrize("roll_first", [True, False], ids=["rolled", "plain"])
@pytest.mark.parametrize("shape", [(2, 8, 12), (3, 6, 7), (2, 4, 96)], ids=str)
def test_a_regrouped_group_fused_onto_other_loops_folds_its_digits(shape, roll_first):
    b, program = _layer_norm_of_cat_and_flat_roll(shape, roll_first)
    scheduled = schedule(lower(program))  # verified: raised SchedulingError before
    for k in scheduled.kernels:  # every loop of a node maps onto the kernel's loops in folded form
        ranges = {str(v): n for v, n in zip(k.xvars + k.rvars, k.xsizes + k.rsizes)}
        for kn in k.nodes:
            for e in kn.var_map.values():
                assert exprs.simplify(e, ranges) == e, (kn.node.name, e)
    gen = torch.Generator().manual_seed(0)
    for _ in range(2):
        x, w = torch.randn(shape, generator=gen), torch.randn(shape[-1], generator=gen)
        for got, want in zip(run(scheduled, x, w), b.eager(x, w)):
            torch.testing.assert_close(got, want)
