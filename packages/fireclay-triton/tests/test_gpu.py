"""The op table and the multi-op programs on a CUDA GPU, in float32, float16 and bfloat16, against
eager on the same device; also autotuning and its on-disk cache. Skipped without CUDA."""

import pytest
import torch

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")

test_op_table = pytest.importorskip("test_op_table", reason="fireclay-loops' tests hold the op table")

import reduction_programs  # noqa: E402
from optable import check_case  # noqa: E402
from programs import PROGRAMS, build_program  # noqa: E402

import fireclay_ir  # noqa: E402
import fireclay_triton  # noqa: E402
from fireclay_triton import Config, compile_program  # noqa: E402

CASES = test_op_table.CASES
TOLERANCE = {torch.float32: None, torch.float16: (2e-2, 2e-2), torch.bfloat16: (8e-2, 5e-2)}
# math whose half-precision results differ from eager's by more than rounding near the edges of
# their domain (eager computes them in float32 then rounds; so do we, but inputs sit at poles)
HALF_SKIP = {"tan.default", "lgamma.default", "acosh.default", "atanh.default", "reciprocal.default",
             "pow.Tensor_Tensor", "pow.fractional", "div.Tensor", "addcdiv.default", "remainder.Tensor",
             "fmod.Tensor", "remainder.negative_dividend", "div.floor", "div.trunc", "floor_divide.default"}


def _is_tensor_spec(a) -> bool:
    if isinstance(a, list):
        return any(_is_tensor_spec(x) for x in a)
    return hasattr(a, "make")


def _has_float_input(args) -> bool:
    def walk(a):
        if isinstance(a, list):
            return any(walk(x) for x in a)
        return getattr(a, "dtype", None) == torch.float32
    return any(walk(a) for a in args)


@pytest.mark.parametrize("dtype", list(TOLERANCE), ids=str)
@pytest.mark.parametrize("op,args,kwargs,atol,rtol,first_only", CASES)
def test_op_matches_eager_on_gpu(op, args, kwargs, atol, rtol, first_only, dtype, request):
    case_id = request.node.callspec.id.split("-")[0]
    if not any(_is_tensor_spec(a) for a in args) or case_id.startswith("sdpa"):
        pytest.skip("the case asks for device='cpu' (no tensor inputs, or a CPU-only attention op)")
    if dtype != torch.float32:
        if not _has_float_input(args) or case_id in HALF_SKIP or case_id.startswith(("mm", "bmm", "addmm", "baddbmm",
                                                                                      "convolution", "sdpa")):
            pytest.skip("no float32 input to lower the precision of, or a pole-sensitive op")
        if case_id.startswith("layer_norm_backward"):
            pytest.skip("eager's CUDA kernel takes float32 mean and rstd only; lowering every input is no real call")
        atol, rtol = (max(atol, TOLERANCE[dtype][0]), max(rtol, TOLERANCE[dtype][1]))
    check_case(op, args, kwargs, atol, rtol, first_only, device="cuda", dtype=dtype)


@pytest.mark.parametrize("looped", [False, True], ids=["persistent", "looped"])
@pytest.mark.parametrize("fn,inputs,atol,rtol", PROGRAMS)
def test_program_matches_eager_on_gpu(fn, inputs, atol, rtol, looped):
    b, program, tensors = build_program(fn, inputs, "cuda")
    cfg = Config(persistent_limit=1) if looped else Config()
    compiled = compile_program(program, tensors, cfg=cfg)
    for seed in (0, 1):
        _, _, tensors = build_program(fn, inputs, "cuda", seed=seed)
        got = compiled(*tensors)
        want = b.eager(*tensors)
        for g, w in zip(got, want):
            assert g.device.type == "cuda" and g.dtype == w.dtype and g.shape == w.shape
            torch.testing.assert_close(g, w, atol=max(atol, 1e-4), rtol=max(rtol, 1e-4))


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=str)
@pytest.mark.parametrize("fn,inputs,atol,rtol", [p for p in PROGRAMS if "mm" not in p.id])
def test_program_half_precision_on_gpu(fn, inputs, atol, rtol, dtype):
    b, program, tensors = build_program(fn, inputs, "cuda", dtype=dtype)
    got = compile_program(program, tensors)(*tensors)
    want = b.eager(*tensors)
    tol = TOLERANCE[dtype]
    for g, w in zip(got, want):
        assert g.dtype == w.dtype and g.shape == w.shape
        torch.testing.assert_close(g.float(), w.float(), atol=tol[0] * 2, rtol=tol[1] * 2)


def test_autotuning_result_is_cached_on_disk(tmp_path, monkeypatch):
    fn, inputs, atol, rtol = PROGRAMS[2].values  # softmax over long rows: several configs to try
    b, program, tensors = build_program(fn, inputs, "cuda")
    monkeypatch.setattr(fireclay_ir.config, "cache_dir", str(tmp_path))
    cfg = Config(autotune=True)
    first = compile_program(program, tensors, cfg=cfg)
    torch.testing.assert_close(first(*tensors)[0], b.eager(*tensors)[0], atol=1e-5, rtol=1e-5)
    assert (tmp_path / "triton" / "autotune.json").exists()
    second = compile_program(program, tensors, cfg=cfg)
    launcher = next(iter(second.launchers.values()))
    launcher.config_for(tuple(tensors), 20, 3000)
    assert launcher.chosen  # read from the cache, without benchmarking again
    torch.testing.assert_close(second(*tensors)[0], b.eager(*tensors)[0], atol=1e-5, rtol=1e-5)


# -- the kernel variants (2D tiles, column reductions, online softmax), CUDA graphs, max-autotune

from test_kernel_variants import (  # noqa: E402
    COLUMN_CASES,
    SPLIT_CASES,
    TILED_CASES,
    program_of,
    softmax_like,
    special_rows,
)

from fireclay_triton import cudagraphify  # noqa: E402


@pytest.mark.parametrize("build,shapes,tiled", TILED_CASES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16], ids=str)
def test_tiled_kernels_on_gpu(build, shapes, tiled, dtype):
    from aten_builder import AtenBuilder
    xs = [torch.randn(s, device="cuda", dtype=dtype) for s in shapes]
    b = AtenBuilder()
    handles = [b.input(x, f"x{i}") for i, x in enumerate(xs)]
    compiled = compile_program(b.output(*build(b, *handles)), xs)
    assert [k.kind for k in compiled.kernels] == (["tiled"] if tiled else ["pointwise"])
    for _ in range(2):
        xs = [torch.randn(s, device="cuda", dtype=dtype) for s in shapes]
        torch.testing.assert_close(compiled(*xs)[0], b.eager(*xs)[0], atol=2e-3, rtol=2e-3)


@pytest.mark.parametrize("build,shape,columns,kind", COLUMN_CASES)
def test_column_reductions_on_gpu(build, shape, columns, kind):
    b, program = program_of(build, torch.empty(shape, device="cuda"))
    compiled = compile_program(program, cfg=Config(autotune=True))
    assert [(k.columns, k.kind) for k in compiled.kernels] == [(columns, kind)]
    for _ in range(2):
        x = torch.randn(shape, device="cuda")
        torch.testing.assert_close(compiled(x)[0], b.eager(x)[0], atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("build,shape,dtype,split", SPLIT_CASES + [
    pytest.param(SPLIT_CASES[0].values[0], (65536, 1024), torch.float32, True, id="sum_65536x1024"),
    pytest.param(SPLIT_CASES[0].values[0], (100000, 7), torch.float32, True, id="sum_100000x7")])
def test_split_column_reductions_on_gpu(build, shape, dtype, split):
    b, program = program_of(build, torch.empty(shape, dtype=dtype, device="cuda"))
    compiled = compile_program(program, cfg=Config(autotune=True))
    assert [k.kind == "split" for k in compiled.kernels if k.kind != "pointwise"] == [split]
    for _ in range(2):
        x = torch.randn(shape, device="cuda", dtype=dtype)
        for got, want in zip(compiled(x), b.eager(x)):
            torch.testing.assert_close(got, want, atol=1e-3, rtol=1e-4)


@pytest.mark.parametrize("op", ["softmax", "log_softmax", "logsumexp"])
@pytest.mark.parametrize("rows,cols", [(6, 1000), (33, 20000), (5, 130)])
def test_online_softmax_on_gpu(op, rows, cols):
    b, program = program_of(softmax_like(op, 1), torch.empty(rows, cols, device="cuda"))
    compiled = compile_program(program, cfg=Config(persistent_limit=64, autotune=True))
    assert [k.kind for k in compiled.kernels] == ["looped"]
    for seed in (0, 1):
        x = special_rows(rows, cols, seed).cuda()
        torch.testing.assert_close(compiled(x)[0], b.eager(x)[0], atol=1e-5, rtol=1e-5, equal_nan=True)


@pytest.mark.parametrize("fn,inputs,atol,rtol", [p for p in PROGRAMS if p.id in (
    "softmax_rows_3000", "layer_norm_768", "mm_bias_relu", "residual_norm_gelu", "pointwise_transposed")])
def test_compiled_programs_under_cuda_graphs(fn, inputs, atol, rtol):
    b, program, tensors = build_program(fn, inputs, "cuda")
    graphed = cudagraphify(compile_program(program, tensors), tensors)
    keep = tensors[1:]  # later inputs stay in place (like weights); the first changes every call
    for seed in range(4):
        _, _, fresh = build_program(fn, inputs, "cuda", seed=seed)
        args = [fresh[0], *keep]
        got, want = graphed(*args), b.eager(*args)
        for g, w in zip(got, want):
            torch.testing.assert_close(g, w, atol=max(atol, 1e-4), rtol=max(rtol, 1e-4))
    assert graphed.recordings == 1 and graphed.replays == 3
    (rec,) = graphed.graphs.values()
    assert rec.copied == [0] and sorted(rec.in_place) == list(range(1, len(tensors)))


@pytest.mark.parametrize("fn,inputs,atol,rtol", [p for p in PROGRAMS if p.id in (
    "softmax_rows_3000", "sum_over_outer_dim", "pointwise_transposed", "layer_norm_2500")])
def test_max_autotune_matches_eager_and_caches_apart(fn, inputs, atol, rtol, tmp_path):
    import json
    b, program, tensors = build_program(fn, inputs, "cuda")
    with fireclay_ir.config.patch(cache_dir=str(tmp_path)):
        compiled = compile_program(program, tensors, cfg=Config(), max_autotune=True)
    for seed in (0, 1):
        _, _, tensors = build_program(fn, inputs, "cuda", seed=seed)
        for g, w in zip(compiled(*tensors), b.eager(*tensors)):
            torch.testing.assert_close(g, w, atol=max(atol, 1e-4), rtol=max(rtol, 1e-4))
    keys = json.loads((tmp_path / "triton" / "autotune.json").read_text())
    assert keys and all("/max/" in k for k in keys)


# -- compiling ahead (fireclay_triton.precompile)


@pytest.mark.parametrize("fn,inputs,atol,rtol", [p for p in PROGRAMS if p.id in (
    "softmax_rows_3000", "sum_over_outer_dim", "pointwise_transposed", "residual_norm_gelu", "var_mean_3001")])
def test_first_call_compiles_nothing_after_compiling_ahead(fn, inputs, atol, rtol, tmp_path, monkeypatch):
    knobs = pytest.importorskip("triton.knobs")
    lazy_compiles = []

    def record(**kw):
        if not kw.get("is_manual_warmup"):
            lazy_compiles.append((kw.get("repr"), str(kw.get("key"))[:400]))
        return False  # compile as usual

    b, program, tensors = build_program(fn, inputs, "cuda")
    with fireclay_ir.config.patch(cache_dir=str(tmp_path / "a")):
        ahead = compile_program(program, tensors, cfg=Config(autotune=True))
    report = ahead.precompile_report
    assert report is not None and report.jobs >= len(ahead.kernels) and not report.failures
    monkeypatch.setattr(knobs.runtime, "jit_cache_hook", record)
    got = ahead(*tensors)
    assert lazy_compiles == []  # every launch of the first call (autotuning included) was compiled ahead
    monkeypatch.setattr(knobs.runtime, "jit_cache_hook", None)
    with fireclay_ir.config.patch(cache_dir=str(tmp_path / "b")):
        lazy = compile_program(program, tensors, cfg=Config(autotune=True, precompile=False))
    assert lazy.precompile_report is None
    for g, want_lazy, want in zip(got, lazy(*tensors), b.eager(*tensors)):
        torch.testing.assert_close(g, want, atol=max(atol, 1e-4), rtol=max(rtol, 1e-4))
        torch.testing.assert_close(g, want_lazy, atol=max(atol, 1e-4), rtol=max(rtol, 1e-4))


def test_a_kernel_that_fails_to_compile_ahead_is_reported_not_raised(tmp_path):
    from target_compile_worker import BROKEN

    from fireclay_triton.precompile import CompileJob, precompile_on_device
    from fireclay_triton.runtime import load_module

    module, _ = load_module(BROKEN, str(tmp_path))
    fn, inputs, _, _ = PROGRAMS[0].values
    _, program, tensors = build_program(fn, inputs, "cuda")
    with fireclay_ir.config.patch(cache_dir=str(tmp_path)):
        good = compile_program(program, tensors, cfg=Config(precompile=False))
    from fireclay_triton.api import program_compile_jobs
    jobs = program_compile_jobs(good, torch.cuda.get_device_name())
    jobs.append(CompileJob("broken_kernel", module.broken_kernel, (torch.float32, 100),
                           (("XBLOCK", 128), ("num_stages", 1), ("num_warps", 4))))
    report = precompile_on_device(jobs)
    assert len(report.failures) == 1 and report.failures[0].startswith("broken_kernel")
    assert report.jobs == len(jobs)


def _c_builds(monkeypatch, tmp_path) -> list:
    """Every C module Triton builds from now on (its driver utilities, a host launcher), with an
    empty Triton cache."""
    import triton.runtime.build as build

    monkeypatch.setenv("TRITON_CACHE_DIR", str(tmp_path / "triton"))
    builds = []
    real = build._build
    monkeypatch.setattr(build, "_build", lambda *a, **k: builds.append(a[0]) or real(*a, **k))
    return builds


@pytest.mark.parametrize("pool", ["threads", "processes"])
def test_kernels_launch_without_building_c_code(pool, tmp_path, monkeypatch):
    monkeypatch.setattr(fireclay_triton.config, "compile_pool", pool)
    builds = _c_builds(monkeypatch, tmp_path)
    for program_id in ("residual_norm_gelu", "softmax_rows_3000", "argmax_ties_2100"):
        fn, inputs, atol, rtol = next(p.values for p in PROGRAMS if p.id == program_id)
        b, program, tensors = build_program(fn, inputs, "cuda")
        with fireclay_ir.config.patch(cache_dir=str(tmp_path / "fireclay")):
            compiled = compile_program(program, tensors, cfg=Config())
        for _ in range(2):
            for g, w in zip(compiled(*tensors), b.eager(*tensors)):
                torch.testing.assert_close(g, w, atol=max(atol, 1e-4), rtol=max(rtol, 1e-4))
    assert builds == []


def test_through_tritons_launcher_the_launchers_are_built_while_compiling(tmp_path, monkeypatch):
    monkeypatch.setattr(fireclay_triton.config, "direct_launch", False)
    builds = _c_builds(monkeypatch, tmp_path)
    fn, inputs, atol, rtol = next(p.values for p in PROGRAMS if p.id == "residual_norm_gelu")
    b, program, tensors = build_program(fn, inputs, "cuda")
    with fireclay_ir.config.patch(cache_dir=str(tmp_path / "fireclay")):
        compiled = compile_program(program, tensors, cfg=Config())
    assert builds, "compiling ahead built no launcher"
    builds.clear()
    for g, w in zip(compiled(*tensors), b.eager(*tensors)):
        torch.testing.assert_close(g, w, atol=max(atol, 1e-4), rtol=max(rtol, 1e-4))
    assert builds == []


# reductions with few outputs and long reductions (fireclay-loops' long_reductions schedule)
LONG_REDUCTION_CASES = [
    (reduction_programs.bn_case("bn_c64_channels_last", 16, 64, 64, 64, True), ["split", "pointwise"]),
    (reduction_programs.bn_case("bn_c64_contiguous", 16, 64, 64, 64, False), ["split", "tiled"]),
    (reduction_programs.bn_case("bn_c512_channels_last", 64, 512, 16, 16, True), ["split", "pointwise"]),
    (reduction_programs.bn_case("bn_c96_ragged_channels_last", 7, 96, 37, 29, True), ["split", "pointwise"]),
    (reduction_programs.bn_forward_case("bn_forward_c64_channels_last", 16, 64, 64, 64, True), ["split", "pointwise"]),
    (reduction_programs.softmax_case("softmax_backward_scale", reduction_programs.softmax_backward_with_scale,
                                     64, 512, 1024), ["persistent", "split"]),
    (reduction_programs.softmax_case("softmax_backward_both", reduction_programs.softmax_backward_both,
                                     64, 512, 1024), ["persistent", "split"]),
]
LONG_REDUCTION_TOLERANCE = {torch.float32: 2e-5, torch.float16: 4e-3, torch.bfloat16: 3e-2}


@pytest.mark.parametrize("dtype", list(LONG_REDUCTION_TOLERANCE), ids=str)
@pytest.mark.parametrize("case,kinds", LONG_REDUCTION_CASES, ids=[c.name for c, _ in LONG_REDUCTION_CASES])
def test_long_reductions_with_few_outputs_on_gpu(case, kinds, dtype):
    from fireclay_loops import lower

    if dtype is torch.float16 and case.name.startswith("softmax"):
        pytest.skip("a float16 sum of 32M products overflows float16 in eager")
    forward = case.build is reduction_programs.batch_norm_training_forward
    if forward and dtype is not torch.float32:
        pytest.skip("half-precision running statistics are not what a training batch norm keeps")
    b, program, make = reduction_programs.build(case, dtype, "cuda")
    compiled = compile_program(lower(program, channels_last=bool(case.channels_last)), cfg=Config(autotune=True))
    if forward and compiled.scheduled.extern_calls:
        pytest.skip("this fireclay-loops calls the library for training batch norm")
    assert [k.kind for k in compiled.kernels] == kinds
    tol = LONG_REDUCTION_TOLERANCE[dtype]
    for _ in range(2):
        inputs = [t.cuda() for t in make()]
        first = compiled(*inputs)
        for got, again, want in zip(first, compiled(*inputs), b.eager(*inputs)):
            assert torch.equal(got, again)  # deterministic: no atomics
            scale = max(1.0, float(want.double().abs().max()))
            torch.testing.assert_close(got.double(), want.double(), atol=tol * scale, rtol=tol)
