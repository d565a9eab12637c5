"""Reductions with few outputs and long reductions spread over programs (fireclay-loops'
``long_reductions`` schedule, the split kernels of :mod:`fireclay_triton.split_reduction`):
batch norm's backward (per-channel sums, then the input gradient in a kernel of its own) and
softmax's backward with the gradient of a scalar scale (per-row partials inside the row kernel),
in both layouts and in float32/float16/bfloat16, run in Triton's interpreter against eager; and
the kernels and launches they make, at the sizes of the GPU benchmarks and here."""

import os

import pytest
import torch
from reduction_programs import (  # fireclay-loops' test helper (see conftest)
    batch_norm_training_forward,
    bn_case,
    bn_forward_case,
    build,
    ln_weight_grad_case,
    mean_of_normalised,
    row_max_of_normalised,
    softmax_backward_both,
    softmax_backward_with_scale,
    softmax_case,
)

from fireclay_loops import lower
from fireclay_triton import compile_program, generate_kernels, to_scheduled
from fireclay_triton.autotune import candidates
from fireclay_triton.runtime import Launcher, split_shape

interpreted = pytest.mark.skipif(os.environ.get("TRITON_INTERPRET") != "1", reason="runs in Triton's interpreter")
H100_SMS = 132


def _kernels(case, device="meta"):
    _, program, _ = build(case, torch.float32, device)
    return generate_kernels(to_scheduled(lower(program, channels_last=bool(case.channels_last)),
                                         split_reductions=True), interpret=False)


def _first_grid(k) -> tuple:
    """The launches of kernel ``k`` at the heuristic config (before any autotuning) on an H100."""
    numel, rnumel = int(k.numel), int(k.rnumel)
    cfg = candidates(k.kind, numel, rnumel, interpret=False, columns=k.columns)[0]
    programs = -(-numel // cfg.XBLOCK)
    if k.kind == "split":
        nsplit, _, fx = split_shape(cfg, numel, rnumel, H100_SMS)
        return (programs, nsplit), (-(-numel // fx),)
    if k.kind == "tiled":
        return ((programs, -(-rnumel // cfg.RBLOCK)),)
    return ((programs,),)


# the benchmarks' shapes: cnn_bn (preset large) has batch norms of 64..512 channels over
# 64 x 128² .. 64 x 16² points; softmax is softmax(x * scale) over [256, 1024, 1024]
GPU_SIZES = [(64, 64, 128), (64, 128, 64), (64, 256, 32), (64, 512, 16)]


@pytest.mark.parametrize("channels_last", [True, False], ids=["channels_last", "contiguous"])
@pytest.mark.parametrize("n,c,hw", GPU_SIZES, ids=[f"c{c}" for _, c, _ in GPU_SIZES])
def test_batch_norm_backward_kernels_at_gpu_sizes(channels_last, n, c, hw):
    kernels = _kernels(bn_case("bn", n, c, hw, hw, channels_last))
    kinds = [k.kind for k in kernels]
    if channels_last or c <= 64:
        # split sums (+ finisher over the channels), then the input gradient over every element
        assert kinds[0] == "split" and kinds[1] in ("pointwise", "tiled") and len(kinds) == 2
        (split, _), (epilogue,) = _first_grid(kernels[0]), _first_grid(kernels[1])
        assert split[0] * split[1] >= 2 * H100_SMS  # every SM gets programs
        assert epilogue[0] * (epilogue[1] if len(epilogue) > 1 else 1) >= 16 * H100_SMS
    else:
        # contiguous rows, one per channel: enough programs already (one kernel, two loops)
        assert kinds in (["looped"], ["persistent"])


def test_softmax_backward_kernels_at_gpu_size():
    for build_fn in (softmax_backward_with_scale, softmax_backward_both):
        kernels = _kernels(softmax_case("softmax", build_fn, 256, 1024, 1024))
        assert [k.kind for k in kernels] == ["persistent", "split"]
        rows, partials = kernels
        assert (int(rows.numel), int(rows.rnumel)) == (256 * 1024, 1024)
        assert (int(partials.numel), int(partials.rnumel)) == (1, 256 * 1024)
        # the row kernel stores its rows' partial sums, never the gradient it sums
        stores = rows.source.count("tl.store(")
        assert stores == (1 if build_fn is softmax_backward_with_scale else 2)


@pytest.mark.parametrize("rows,cols", [(65536, 1024), (16384, 768)])
def test_layer_norm_weight_grad_is_split_at_gpu_sizes(rows, cols):
    # per-row mean and rstd read beside the columns do not make it a row reduction: before,
    # 1024 outputs ran on 32 programs (H100: 0.337 ms, 53% of copy bandwidth)
    (kernel,) = _kernels(ln_weight_grad_case("ln", rows, cols))
    assert kernel.kind == "split" and kernel.columns
    (split, _) = _first_grid(kernel)
    assert split[0] * split[1] >= 2 * H100_SMS


def _record_launches(monkeypatch) -> list:
    launches = []
    original = Launcher._launch

    def record(self, fn, grid, args, options):
        role = "finisher" if fn is self.finisher else self.kind
        launches.append((self.name, role, tuple(grid)))
        return original(self, fn, grid, args, options)

    monkeypatch.setattr(Launcher, "_launch", record)
    return launches


BN_CASES = [
    bn_case("few_channels_channels_last", 2, 4, 128, 128, True),
    bn_case("few_channels_contiguous", 2, 4, 128, 128, False),
    bn_case("columns_channels_last", 3, 24, 40, 40, True),  # 24 channels over 4800 points
    bn_case("ragged_channels_last", 3, 5, 107, 103, True),
    bn_case("ragged_contiguous", 3, 5, 107, 103, False),
    bn_case("many_channels_not_split", 2, 96, 12, 12, True),
    # the forward's statistics: a Welford reduction split the same way (when lowered to loops)
    bn_forward_case("forward_channels_last", 2, 4, 128, 128, True),
    bn_forward_case("forward_ragged_contiguous", 3, 5, 107, 103, False),
]
TOLERANCE = {torch.float32: 2e-5, torch.float16: 4e-3, torch.bfloat16: 3e-2}


def _check(compiled, b, make, dtype):
    for _ in range(2):
        inputs = make()
        for got, want in zip(compiled(*inputs), b.eager(*inputs)):
            assert got.dtype == want.dtype and got.shape == want.shape
            # against eager in float64 would hide nothing more: eager rounds each op in ``dtype``
            scale = max(1.0, float(want.double().abs().max()))
            torch.testing.assert_close(got.double(), want.double(), atol=TOLERANCE[dtype] * scale,
                                       rtol=TOLERANCE[dtype])


# the forward in half precision: torch's meta kernel gives float32 statistics (as CUDA does), its
# CPU kernel half ones, so eager on the CPU is no oracle for the program's metadata there
BN_PARAMS = [pytest.param(c, d, id=f"{c.name}-{d}") for c in BN_CASES
             for d in (torch.float32, torch.float16, torch.bfloat16)
             if d is torch.float32 or c.build is not batch_norm_training_forward]


@interpreted
@pytest.mark.parametrize("case,dtype", BN_PARAMS)
def test_batch_norm_matches_eager(case, dtype, monkeypatch):
    b, program, make = build(case, dtype, seed=5)
    launches = _record_launches(monkeypatch)
    compiled = compile_program(lower(program, channels_last=bool(case.channels_last)))
    if case.build is batch_norm_training_forward and compiled.scheduled.extern_calls:
        pytest.skip("this fireclay-loops calls the library for training batch norm")
    _check(compiled, b, make, dtype)
    roles = [role for _, role, _ in launches[: len(launches) // 2]]
    if case.name == "many_channels_not_split":
        assert roles == ["persistent"]
    else:
        assert roles[:2] == ["split", "finisher"] and roles[2] in ("pointwise", "tiled") and len(roles) == 3
        assert launches[0][2][1] > 1  # the sums run on several chunks of N*H*W


SOFTMAX_CASES = [
    softmax_case("softmax_backward_scale", softmax_backward_with_scale, 3, 50, 300),
    softmax_case("softmax_backward_both", softmax_backward_both, 3, 50, 300),
    softmax_case("softmax_backward_long_rows", softmax_backward_with_scale, 2, 3, 20000),
    softmax_case("softmax_backward_few_long_rows", softmax_backward_with_scale, 1, 3, 40000),
    softmax_case("max_of_softmax", row_max_of_normalised, 3, 7, 301),
    softmax_case("mean_of_centred", mean_of_normalised, 2, 9, 257),
]


# float16 rows of 40000 random products overflow in eager (its scalar is NaN): not compared
SOFTMAX_PARAMS = [pytest.param(c, d, id=f"{c.name}-{d}") for c in SOFTMAX_CASES
                  for d in (torch.float32, torch.float16, torch.bfloat16)
                  if not (d is torch.float16 and c.name == "softmax_backward_few_long_rows")]


@interpreted
@pytest.mark.parametrize("case,dtype", SOFTMAX_PARAMS)
def test_scalar_of_row_kernel_matches_eager(case, dtype, monkeypatch):
    b, program, make = build(case, dtype, seed=7)
    launches = _record_launches(monkeypatch)
    compiled = compile_program(program)
    _check(compiled, b, make, dtype)
    # the row kernel (with the partials), then the reduction of the partials to the scalar
    names = list(dict.fromkeys(name for name, _, _ in launches))
    assert len(names) == 2
    assert compiled.kernels[1].numel == 1


LN_PARAMS = [pytest.param(rows, cols, d, id=f"{rows}x{cols}-{d}") for rows, cols in [(5000, 24), (4100, 33)]
             for d in (torch.float32, torch.float16, torch.bfloat16)]


@interpreted
@pytest.mark.parametrize("rows,cols,dtype", LN_PARAMS)
def test_layer_norm_weight_grad_matches_eager(rows, cols, dtype, monkeypatch):
    b, program, make = build(ln_weight_grad_case("ln", rows, cols), dtype, seed=11)
    launches = _record_launches(monkeypatch)
    compiled = compile_program(program)
    _check(compiled, b, make, dtype)
    roles = [role for _, role, _ in launches[: len(launches) // 2]]
    assert roles == ["split", "finisher"] and launches[0][2][1] > 1


@interpreted
def test_split_reductions_are_deterministic():
    b, program, make = build(bn_case("bn", 2, 4, 128, 128, True), torch.float32, seed=9)
    compiled = compile_program(lower(program, channels_last=True))
    inputs = make()
    first = compiled(*inputs)
    for a, c in zip(first, compiled(*inputs)):
        assert torch.equal(a, c)
