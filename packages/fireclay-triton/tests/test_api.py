"""The compile API around the kernels: artifacts and dumps, 64-bit indexing, symbolic sizes,
memory reuse, launch configs and their cache, and errors for users."""

import os

import pytest
import torch
from aten_builder import AtenBuilder, T
from programs import PROGRAMS, build_program

import fireclay_ir
from fireclay_ir import Graph, Program, TensorMeta
from fireclay_loops import lower, schedule
from fireclay_triton import (
    CodegenError,
    Config,
    InputError,
    compile_program,
    generate_kernels,
    triton_backend,
)
from fireclay_triton.autotune import LaunchConfig, TuningCache, candidates, next_pow2, tuning_key

interpreted = pytest.mark.skipif(os.environ.get("TRITON_INTERPRET") != "1", reason="runs in Triton's interpreter")


def _softmax_program(rows: int, cols: int):
    fn, _, _, _ = PROGRAMS[2].values
    return build_program(fn, (T(rows, cols),), "cpu")


@pytest.mark.parametrize("cols,kind", [(100, "persistent"), (16384, "persistent"), (16385, "looped"), (40000, "looped")])
def test_reduction_kind_follows_its_length(cols, kind):
    _, program, _ = _softmax_program(3, cols)
    (k,) = generate_kernels(schedule(lower(program)), interpret=False)
    assert k.kind == kind
    assert ("for roffset in range(0, rnumel, RBLOCK):" in k.source) == (kind == "looped")
    assert "libdevice" not in k.source  # exp and friends are tl builtins


def _two_softmaxes_around_a_matmul():
    """softmax(softmax(x) @ w): two kernels doing the same work on different buffers."""
    b = AtenBuilder()
    x = b.input(torch.empty(6, 6, device="meta"), "x")
    w = b.input(torch.empty(6, 6, device="meta"), "w")
    first = b.call("_softmax.default", x, 1, False)
    return b.output(b.call("_softmax.default", b.call("mm.default", first, w), 1, False))


def test_kernels_doing_the_same_work_share_one_function():
    kernels = generate_kernels(schedule(lower(_two_softmaxes_around_a_matmul())), interpret=False)
    assert len(kernels) == 2 and kernels[0].buffers != kernels[1].buffers
    assert kernels[0].function == kernels[1].function and kernels[0].source == kernels[1].source
    # buffer names never reach a kernel's text: its arguments are positional
    assert not any(name in kernels[0].source for name in kernels[0].buffers)
    # and the name follows from the text alone, whichever program and process made it
    again = generate_kernels(schedule(lower(_two_softmaxes_around_a_matmul())), interpret=False)
    assert again[0].function == kernels[0].function


@interpreted
def test_a_shared_function_runs_each_kernel_on_its_own_buffers(tmp_path):
    program = _two_softmaxes_around_a_matmul()
    with fireclay_ir.config.patch(cache_dir=str(tmp_path)):
        compiled = compile_program(program, cfg=Config())
    (function,) = {k.function for k in compiled.kernels}
    assert compiled.kernel_source.count(f"def {function}(") == 1 and len(compiled.kernels) == 2
    x, w = torch.randn(6, 6), torch.randn(6, 6)
    torch.testing.assert_close(compiled(x, w)[0], torch.softmax(torch.softmax(x, 1) @ w, 1))


def test_huge_sizes_index_in_64_bits():
    b = AtenBuilder()
    x = b.input(torch.empty(50000, 50000, device="meta"), "x")
    program = b.output(b.call("relu.default", x))
    (k,) = generate_kernels(schedule(lower(program)), interpret=False)
    assert k.index64 and ".to(tl.int64)" in k.source
    b = AtenBuilder()
    x = b.input(torch.empty(500, 500, device="meta"), "x")
    (k,) = generate_kernels(schedule(lower(b.output(b.call("relu.default", x)))), interpret=False)
    assert not k.index64 and "tl.int64" not in k.source


def test_gpu_source_calls_libdevice_where_tl_has_no_builtin():
    b = AtenBuilder()
    x = b.input(torch.empty(4, 8, device="meta"), "x")
    program = b.output(b.call("tanh.default", b.call("lgamma.default", x)))
    (k,) = generate_kernels(schedule(lower(program)), interpret=False)
    assert "libdevice.lgamma(" in k.source and "libdevice.tanh(" in k.source
    with pytest.raises(CodegenError, match="lgamma needs CUDA's libdevice"):
        generate_kernels(schedule(lower(program)), interpret=True)


@interpreted
def test_symbolic_batch_size_is_a_kernel_argument():
    g = Graph("main")
    x = g.add_input("x", TensorMeta("float32", ("s0", 8)))
    m = g.call("aten::amax.default", (x, [1], True), out=TensorMeta("float32", ("s0", 1)))
    s = g.call("aten::sub.Tensor", (x, m), out=TensorMeta("float32", ("s0", 8)))
    e = g.call("aten::exp.default", (s,), out=TensorMeta("float32", ("s0", 8)))
    z = g.call("aten::sum.dim_IntList", (e, [1], True), out=TensorMeta("float32", ("s0", 1)))
    o = g.call("aten::div.Tensor", (e, z), out=TensorMeta("float32", ("s0", 8)))
    g.set_outputs([o])
    p = Program.single(g)
    p.add_symbol("s0", hint=4, min=2)
    compiled = compile_program(p)
    (k,) = compiled.kernels
    assert k.index64  # a symbolic size may grow past 2**31
    assert "s0 = in_x.shape[0]" in compiled.wrapper_source or "s0 = x.shape[0]" in compiled.wrapper_source
    for n in (3, 7, 40):
        xv = torch.randn(n, 8)
        torch.testing.assert_close(compiled(xv)[0], torch.softmax(xv, 1))


@interpreted
def test_dump_writes_readable_artifacts(tmp_path):
    b, program, tensors = _softmax_program(5, 40)
    with fireclay_ir.config.patch(cache_dir=str(tmp_path / "cache")):
        compiled = compile_program(program, tensors, cfg=Config())
    paths = compiled.dump(str(tmp_path / "dump"))
    names = sorted(os.path.basename(p) for p in paths)
    assert names == ["kernels.py", "schedule.txt", "wrapper.py"]
    kernels = (tmp_path / "dump" / "kernels.py").read_text()
    function = compiled.kernels[0].function
    assert "@triton.jit" in kernels and f"def {function}(" in kernels
    assert "kernel0(" in (tmp_path / "dump" / "wrapper.py").read_text()
    assert f"{function} in kernels.py" in (tmp_path / "dump" / "wrapper.py").read_text()
    # the kernel module lives in our cache, named by its hash
    assert any(f.endswith(".py") for f in os.listdir(tmp_path / "cache" / "triton" / "kernels"))


@interpreted
def test_dump_folder_from_config(tmp_path):
    _, program, tensors = _softmax_program(2, 16)
    compile_program(program, tensors, cfg=Config(dump_dir=str(tmp_path)))
    (folder,) = os.listdir(tmp_path)
    assert sorted(os.listdir(tmp_path / folder)) == ["kernels.py", "schedule.txt", "wrapper.py"]


@interpreted
def test_intermediate_buffers_reuse_memory():
    gen = torch.Generator().manual_seed(3)
    b = AtenBuilder()
    xs = [T(64, 64).make(gen) for _ in range(2)]
    x, y = (b.input(t, f"x{i}") for i, t in enumerate(xs))
    h = b.call("mm.default", x, y)
    h = b.call("relu.default", h)
    h = b.call("mm.default", h, y)
    h = b.call("sigmoid.default", h)
    h = b.call("mm.default", h, y)
    program = b.output(b.call("tanh.default", h))
    compiled = compile_program(program, xs)
    torch.testing.assert_close(compiled(*xs)[0], b.eager(*xs)[0], atol=1e-4, rtol=1e-4)
    assert compiled.scheduled.plan.reuses, "the program is long enough for buffers to be reused"


@interpreted
def test_backend_entry_and_input_errors():
    b, program, tensors = _softmax_program(3, 10)
    fn = triton_backend(program, tensors)
    torch.testing.assert_close(fn(*tensors)[0], b.eager(*tensors)[0])
    with pytest.raises(InputError, match="takes 1 inputs, got 2"):
        fn(tensors[0], tensors[0])
    with pytest.raises(InputError, match=r"has shape \(3, 11\), the program was compiled for \(3, 10\)"):
        fn(torch.randn(3, 11))
    with pytest.raises(InputError, match="torch.float64"):
        fn(torch.randn(3, 10, dtype=torch.float64))


@interpreted
def test_non_contiguous_input_is_copied_to_the_compiled_layout():
    b, program, tensors = _softmax_program(6, 20)
    compiled = compile_program(program, tensors)
    x = torch.randn(20, 6).t()
    torch.testing.assert_close(compiled(x)[0], torch.softmax(x, 1))


@pytest.mark.parametrize("kind", ["pointwise", "persistent", "looped"])
@pytest.mark.parametrize("numel,rnumel", [(1, 1), (7, 300), (5000, 1000), (3, 100000), (1 << 20, 4096)])
def test_launch_candidates_fit_the_problem(kind, numel, rnumel):
    if kind == "persistent" and rnumel > 4096:
        pytest.skip("not persistent")
    for interpret in (False, True):
        found = candidates(kind, numel, rnumel, interpret)
        assert found and len(found) == len(set(found))
        for c in found:
            assert c.XBLOCK <= next_pow2(numel) and c.XBLOCK & (c.XBLOCK - 1) == 0
            if kind == "persistent":
                assert c.RBLOCK >= rnumel
            elif kind == "looped":
                assert 0 < c.RBLOCK <= next_pow2(rnumel)
            else:
                assert c.RBLOCK == 0


def test_tuning_cache_round_trips_through_disk(tmp_path):
    key = tuning_key("abc", 1000, 3000, "NVIDIA H100")
    assert key != tuning_key("abc", 5000, 3000, "NVIDIA H100") and "triton-" in key
    cache = TuningCache(str(tmp_path))
    assert cache.get(key) is None
    cache.put(key, LaunchConfig(8, 512, 8, 2))
    assert TuningCache(str(tmp_path)).get(key) == LaunchConfig(8, 512, 8, 2)


@interpreted
@pytest.mark.parametrize("rows,cols", [(6, 40), (3, 20000)])
def test_scaled_softmax_stores_only_its_result(rows, cols, tmp_path):
    # the scaled input and exp(x - max) are computed again by each loop that reads them (one tile:
    # kept in registers), never written to memory
    x, scale = torch.randn(rows, cols), torch.randn(())
    b = AtenBuilder()
    hx, hs = b.input(x, "x"), b.input(scale, "scale")
    program = b.output(b.call("_softmax.default", b.call("mul.Tensor", hx, hs), 1, False))
    with fireclay_ir.config.patch(cache_dir=str(tmp_path)):
        compiled = compile_program(program, cfg=Config())
    (k,) = compiled.kernels
    assert k.kind == ("persistent" if cols <= 16384 else "looped")
    assert k.source.count("tl.store(") == 1
    torch.testing.assert_close(compiled(x, scale)[0], torch.softmax(x * scale, 1), atol=1e-6, rtol=1e-5)
