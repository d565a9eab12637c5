"""Schedules that keep reductions with few outputs splittable over a GPU's programs
(``schedule(..., split_reductions=True)``, on by default for CUDA programs): the epilogue of such
a reduction gets a kernel of its own, and a scalar reduction of a row kernel's result becomes
per-row partials inside that kernel. Kernel structure on meta programs at GPU sizes; results
against eager through the reference executor at small sizes of the same shapes."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from reduction_programs import (  # noqa: E402
    batch_norm_backward,
    batch_norm_training_forward,
    bn_case,
    bn_forward_case,
    build,
    layer_norm_weight_grad,
    ln_weight_grad_case,
    mean_of_normalised,
    row_max_of_normalised,
    softmax_backward_both,
    softmax_backward_with_scale,
    softmax_case,
)

from fireclay_loops import ExternNode, config, lower, schedule  # noqa: E402
from fireclay_loops.long_reductions import few_outputs  # noqa: E402
from fireclay_loops.reference import run  # noqa: E402


def _scheduled(case, dtype=torch.float32, device="cpu", split=True, seed=0):
    b, program, make = build(case, dtype, device, seed)
    return b, schedule(lower(program, channels_last=bool(case.channels_last)), split_reductions=split), make


def _stores_over_loop(kernel) -> set[str]:
    """Buffers a kernel stores at an index over its reduction loop."""
    rvars = set(kernel.rvars)
    return {b for kn in kernel.nodes for b, i, _ in kn.writes()
            if b not in kernel.internal and i.free_symbols & rvars}


@pytest.mark.parametrize("channels_last", [True, False], ids=["channels_last", "contiguous"])
@pytest.mark.parametrize("n,c,hw", [(64, 64, 128), (64, 512, 16), (8, 32, 64)])
def test_batch_norm_backward_at_gpu_sizes_has_its_epilogue_apart(channels_last, n, c, hw):
    case = bn_case("bn", n, c, hw, hw, channels_last)
    _, scheduled, _ = _scheduled(case, device="meta")
    kinds = [k.kind for k in scheduled.kernels]
    columns = channels_last
    if few_outputs(c, n * hw * hw, columns):
        # the sums (and what follows over channels), then the input gradient over every element;
        # the reduction kernel stores nothing over N*H*W: the epilogue recomputes what it needs
        assert kinds == ["reduction", "pointwise"]
        reduction = scheduled.kernels[0]
        assert _stores_over_loop(reduction) == set()
        assert reduction.rnumel == n * hw * hw and reduction.numel == c
        assert any("could not be split" in d.reason for d in scheduled.decisions)
    else:
        assert kinds == ["reduction"]
    _, unsplit, _ = _scheduled(case, device="meta", split=False)
    assert [k.kind for k in unsplit.kernels] == ["reduction"]


@pytest.mark.parametrize("channels_last", [True, False], ids=["channels_last", "contiguous"])
def test_batch_norm_training_forward_at_gpu_size_normalises_apart(channels_last):
    """Per-channel statistics (Welford), then the normalisation and ReLU over every element."""
    _, scheduled, _ = _scheduled(bn_forward_case("bn_forward", 64, 64, 128, 128, channels_last), device="meta")
    if scheduled.extern_calls:
        pytest.skip("this fireclay-loops calls the library for training batch norm")
    assert [k.kind for k in scheduled.kernels] == ["reduction", "pointwise"]
    assert _stores_over_loop(scheduled.kernels[0]) == set()


def test_split_follows_the_device_types_of_the_config(monkeypatch):
    """By default only CUDA programs are scheduled this way: a CPU program (fireclay-cpp's)
    keeps its one kernel."""
    case = bn_case("bn", 64, 64, 128, 128, True)
    b, program, _ = build(case, torch.float32, "meta")  # traced on meta: a "cpu" program
    assert config.split_reductions == ("cuda",)
    assert len(schedule(lower(program, channels_last=True)).kernels) == 1
    monkeypatch.setattr(config, "split_reductions", ("cpu",))
    assert len(schedule(lower(program, channels_last=True)).kernels) == 2


def test_many_rows_keep_their_epilogue():
    """Softmax over many long rows is one kernel either way: enough programs already."""
    def softmax(b, x, y, grad):
        return [b.call("_softmax.default", x, -1, False)]
    _, scheduled, _ = _scheduled(softmax_case("softmax", softmax, 16, 256, 40000), device="meta")
    assert len(scheduled.kernels) == 1


SCALAR_CASES = [
    softmax_case("softmax_backward_scale", softmax_backward_with_scale, 256, 1024, 1024),
    softmax_case("softmax_backward_both", softmax_backward_both, 256, 1024, 1024),
    softmax_case("max_of_softmax", row_max_of_normalised, 4, 33, 1000),
    softmax_case("mean_of_centred", mean_of_normalised, 4, 33, 1000),
]


@pytest.mark.parametrize("case", SCALAR_CASES, ids=[c.name for c in SCALAR_CASES])
def test_scalar_reduction_of_a_row_kernel_is_partials_in_that_kernel(case):
    _, scheduled, _ = _scheduled(case, device="meta")
    first, second = scheduled.kernels
    rows = case.shapes[0][0] * case.shapes[0][1]
    assert (first.numel, first.rnumel) == (rows, case.shapes[0][2])
    assert (second.numel, second.rnumel) == (1, rows)
    # nothing over the whole tensor is stored but the outputs
    big = {b for b in first.write_buffers() if scheduled.program.buffers[b].numel == rows * case.shapes[0][2]}
    assert big <= scheduled.program.output_buffers()
    _, unsplit, _ = _scheduled(case, device="meta", split=False)
    assert sum(1 for d in unsplit.decisions if d.action == "split") == 0


def test_scalar_reduction_without_a_row_kernel_is_left_alone():
    def total(b, x, y, grad):
        return [b.call("sum.default", b.call("mul.Tensor", x, y))]
    _, scheduled, _ = _scheduled(softmax_case("plain_sum", total, 8, 64, 300), device="meta")
    assert [(k.numel, k.rnumel) for k in scheduled.kernels] == [(1, 8 * 64 * 300)]


RUN_CASES = [
    bn_case("bn_channels_last_few_rows", 2, 4, 128, 128, True),
    bn_case("bn_contiguous_few_rows", 2, 4, 128, 128, False),
    bn_case("bn_channels_last_columns", 3, 24, 40, 40, True),  # 24 channels over 4800 points
    bn_case("bn_ragged", 3, 5, 107, 103, True),
    bn_forward_case("bn_forward_channels_last", 2, 4, 128, 128, True),
    bn_forward_case("bn_forward_contiguous_ragged", 3, 5, 107, 103, False),
    softmax_case("softmax_backward_scale", softmax_backward_with_scale, 3, 50, 300),
    softmax_case("softmax_backward_both", softmax_backward_both, 3, 50, 300),
    softmax_case("max_of_softmax", row_max_of_normalised, 3, 7, 301),
    softmax_case("mean_of_centred", mean_of_normalised, 2, 9, 257),
    ln_weight_grad_case("layer_norm_weight_grad", 5000, 24),
]


@pytest.mark.parametrize("rows,cols", [(65536, 1024), (16384, 768), (5000, 24)])
def test_layer_norm_weight_grad_is_a_column_reduction_despite_its_per_row_values(rows, cols):
    from fireclay_loops.long_reductions import reduces_columns

    _, scheduled, _ = _scheduled(ln_weight_grad_case("ln", rows, cols), device="meta")
    (kernel,) = scheduled.kernels
    indices = [i for kn in kernel.nodes for _, i, _ in (*kn.reads(), *kn.writes())]
    assert reduces_columns(indices, kernel.xvars, kernel.rvars)
    assert few_outputs(kernel.numel, kernel.rnumel, columns=True)


@pytest.mark.parametrize("case", RUN_CASES, ids=[c.name for c in RUN_CASES])
def test_split_schedules_match_eager(case):
    b, scheduled, make = _scheduled(case, seed=3)
    if case.build is batch_norm_training_forward and any(isinstance(s, ExternNode) for s in scheduled.steps):
        pytest.skip("this fireclay-loops calls the library for training batch norm")
    if case.build in (batch_norm_backward, batch_norm_training_forward):
        assert len(scheduled.kernels) == 2
    elif case.build is layer_norm_weight_grad:  # both column sums in one kernel (the backend splits it)
        assert len(scheduled.kernels) == 1
    else:
        assert any(d.action == "split" for d in scheduled.decisions)
    for _ in range(2):
        inputs = make()
        for got, want in zip(run(scheduled, *inputs), b.eager(*inputs)):
            scale = max(1.0, float(want.abs().max()))
            torch.testing.assert_close(got, want, atol=2e-5 * scale, rtol=1e-4)
