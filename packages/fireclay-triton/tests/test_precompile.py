"""Compiling kernels ahead of the first call: the jobs cover every launch the first call makes,
parallel compilation gives the binaries serial compilation gives, a warm cache compiles nothing,
and a kernel that fails to compile is named. Triton compiles for an sm_90 target without a GPU
(its bundled ptxas), so this runs on CPU, in subprocesses without ``TRITON_INTERPRET``."""

import json
import os
import subprocess
import sys

import pytest
import torch
from programs import PROGRAMS, build_program

from fireclay_triton import Config, compile_program
from fireclay_triton.autotune import LaunchConfig, TuningCache, candidates
from fireclay_triton.precompile import launch_options
from fireclay_triton.runtime import Launcher, split_shape

HERE = os.path.dirname(os.path.abspath(__file__))


def _target_compile(workers, ids, cache, triton_cache):
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env.update(FIRECLAY_CACHE_DIR=str(cache), TRITON_CACHE_DIR=str(triton_cache))
    done = subprocess.run([sys.executable, os.path.join(HERE, "target_compile_worker.py"), str(workers), *ids],
                          env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    found = json.loads(done.stdout.strip().splitlines()[-1])
    # the compile server's warm-up kernel (a GPU compiles ahead through the server in any case)
    warm_up = [path for path in found["cubins"] if path.endswith("/first_kernel.cubin")]
    found["warmed_up"] = bool(warm_up)
    for path in warm_up:
        del found["cubins"][path]
    return found


@pytest.mark.parametrize("kind,numel,rnumel,columns", [
    ("pointwise", 15000, 1, False), ("persistent", 20, 3000, False), ("looped", 9, 20000, False),
    ("looped", 12, 2000, True), ("tiled", 129, 37, False), ("split", 40, 5000, True)])
@pytest.mark.parametrize("autotune", [True, False])
@pytest.mark.parametrize("wide", [False, True])
def test_jobs_are_the_launches_of_the_first_call(kind, numel, rnumel, columns, autotune, wide, tmp_path):
    fn, finisher = object(), object()
    launcher = Launcher(fn, "k", kind, "hash", autotune or wide, False, TuningCache(str(tmp_path)),
                        columns=columns, max_autotune=wide, finisher=finisher, partials=1)
    args = (torch.float32, torch.float16, 7)
    options = candidates(kind, numel, rnumel, False, columns, wide)
    tried = options if (autotune or wide) else options[:1]
    jobs = launcher.compile_jobs(args, numel, rnumel, device_name="GPU", sms=132)
    per_config = 2 if kind == "split" else 1
    assert len(jobs) == per_config * len(tried)
    for cfg, job in zip(tried, jobs[::per_config]):
        assert job.fn is fn and job.options == launch_options(cfg, kind)
        extra = (numel,) if kind == "pointwise" else (numel, rnumel)
        if kind == "split":
            nsplit, chunk, fx = split_shape(cfg, numel, rnumel, 132)
            extra = (torch.float32, chunk, numel, rnumel)
        assert job.args == args + extra
    if kind == "split":
        finish = jobs[1]
        nsplit, _, fx = split_shape(tried[0], numel, rnumel, 132)
        assert finish.fn is finisher and finish.args == args + (torch.float32, nsplit, numel)
        assert finish.kwargs == {"XBLOCK": fx, "NSPLIT": 1 << (nsplit - 1).bit_length(), "num_warps": 4}
    # a choice cached on disk for this GPU leaves one config to compile; another GPU's does not
    chosen = LaunchConfig(options[-1].XBLOCK, options[-1].RBLOCK, 2, 1)
    launcher.cache.put(launcher._key(numel, rnumel, "GPU"), chosen)
    assert len(launcher.compile_jobs(args, numel, rnumel, device_name="other GPU", sms=132)) == len(jobs)
    if len(tried) > 1:
        again = launcher.compile_jobs(args, numel, rnumel, device_name="GPU", sms=132)
        assert len(again) == per_config and again[0].options == launch_options(chosen, kind)
    assert launcher.compile_jobs(args, 0, rnumel, device_name="GPU", sms=132) == []


def test_default_sets_are_small_and_max_autotune_is_wider():
    for kind, numel, rnumel in [("pointwise", 1 << 20, 1), ("tiled", 512, 512), ("persistent", 4096, 768),
                                ("looped", 4096, 30000), ("split", 64, 100000)]:
        small, wide = candidates(kind, numel, rnumel, False), candidates(kind, numel, rnumel, False, wide=True)
        assert len(small) <= 3 and len(wide) > len(small) and set(small) <= set(wide)
    assert len(candidates("pointwise", 1 << 24, 1, False)) == 1


def test_parallel_target_compile_matches_serial_and_warm_cache_compiles_nothing(tmp_path):
    parallel = _target_compile("2", ["split"], tmp_path / "a", tmp_path / "ta")
    assert not parallel["failures"] and parallel["jobs"] >= 4
    assert any(n.endswith("_finish") for n in parallel["names"])  # the split kernel's second kernel
    assert len(parallel["cubins"]) == parallel["jobs"]
    # the same kernel files (their paths are in the line info), a fresh Triton cache
    serial = _target_compile("1", ["split"], tmp_path / "a", tmp_path / "tb")
    binaries = {path: digest for path, (digest, _) in parallel["cubins"].items()}
    assert {path: digest for path, (digest, _) in serial["cubins"].items()} == binaries  # same keys, same binaries
    warm = _target_compile("2", ["split"], tmp_path / "a", tmp_path / "ta")
    assert warm["cubins"] == parallel["cubins"] and not warm["failures"]  # nothing written again


def test_the_compile_server_compiles_and_names_a_kernel_that_does_not_compile(tmp_path):
    found = _target_compile("p2", ["split", "broken"], tmp_path / "a", tmp_path / "ta")
    assert len(found["failures"]) == 1 and found["failures"][0].startswith("broken_kernel: CompilationError")
    assert found["warmed_up"]  # the server warmed up first
    assert found["jobs"] - 1 == len(found["cubins"]) >= 4  # the others compiled


@pytest.mark.skipif(torch.cuda.is_available(), reason="the interpreted path")
@pytest.mark.parametrize("precompile", [True, False])
def test_interpreter_keeps_the_lazy_path(precompile):
    fn, inputs, atol, rtol = PROGRAMS[2].values
    b, program, tensors = build_program(fn, inputs, "cpu")
    compiled = compile_program(program, tensors, cfg=Config(precompile=precompile))
    assert compiled.precompile_report is None
    torch.testing.assert_close(compiled(*tensors)[0], b.eager(*tensors)[0], atol=1e-5, rtol=1e-5)


def test_tuning_caches_of_several_programs_merge_on_disk(tmp_path):
    # every program's cache is read at compile time, before any of them tunes on its first call
    first, second = TuningCache(str(tmp_path)), TuningCache(str(tmp_path))
    assert first.get("a") is None and second.get("b") is None
    first.put("a", LaunchConfig(64))
    second.put("b", LaunchConfig(128))
    fresh = TuningCache(str(tmp_path))
    assert fresh.get("a") == LaunchConfig(64) and fresh.get("b") == LaunchConfig(128)


def test_long_persistent_rows_keep_two_configs_to_tune():
    for rnumel in (3000, 5000, 9000):
        assert len(candidates("persistent", 20, rnumel, False)) == 2


_SOURCE_OF_INDEXED_PROGRAMS = """
import hashlib, sys, torch
sys.path[:0] = sys.argv[1:]
from aten_builder import AtenBuilder
from fireclay_loops import lower, schedule
from fireclay_triton import generate_kernels
from fireclay_triton.api import kernel_module_source
b = AtenBuilder()
w, i = b.input(torch.randn(10, 6), "w"), b.input(torch.randint(0, 10, (3, 5)), "i")
x = b.input(torch.randn(3, 4, 5), "x")
j, k = b.input(torch.randint(0, 3, (6,)), "j"), b.input(torch.randint(0, 5, (6,)), "k")
e = b.call("embedding.default", w, i)
g = b.call("index.Tensor", x, [j, None, k])
kernels = generate_kernels(schedule(lower(b.output(e, g))), interpret=False)
print(hashlib.sha256(kernel_module_source(kernels, False).encode()).hexdigest())
"""


def test_kernel_source_is_the_same_in_every_process():
    # the source's hash keys our kernel files and tuning results, and Triton's cache: a text that
    # varied with the string hash seed would miss every cache in a warm process
    paths = [HERE, os.path.join(HERE, "..", "..", "fireclay-loops", "tests")]
    digests = set()
    for seed in ("1", "2", "3"):
        env = dict(os.environ, PYTHONHASHSEED=seed)
        done = subprocess.run([sys.executable, "-c", _SOURCE_OF_INDEXED_PROGRAMS, *paths], env=env,
                              capture_output=True, text=True, timeout=120)
        assert done.returncode == 0, done.stderr[-3000:]
        digests.add(done.stdout.strip().splitlines()[-1])
    assert len(digests) == 1


def _hang(spec, target, binaries):  # a compile that never finishes
    import time

    time.sleep(60)


def _fail_or_compile(spec, target, binaries):  # jobs with an even first argument compile, odd ones fail
    return (None if spec.args[0] % 2 == 0 else f"{spec.name}: failed"), None


def _jobs(n):
    from fireclay_triton.precompile import CompileJob
    from fireclay_triton.warmup import first_kernel

    return [CompileJob(f"k{i}", first_kernel, (i,), ()) for i in range(n)]


def _group_alive(pgid):
    try:
        os.killpg(pgid, 0)
        return True
    except ProcessLookupError:
        return False


@pytest.mark.parametrize("jobs", [1, 3])
def test_a_stuck_compile_server_is_stopped_with_its_workers(monkeypatch, jobs):
    import time

    from fireclay_triton import compile_server

    monkeypatch.setattr(compile_server, "_compile_spec", _hang)  # before the fork: the server inherits it
    monkeypatch.setattr(compile_server, "TIMEOUT_S", 2.0)
    server = compile_server.CompileServer(target=None, workers=2)
    pgid = server.pid
    start = time.monotonic()
    assert server.compile(_jobs(jobs)) is None  # the caller compiles in its own process
    assert time.monotonic() - start < 30
    assert not server.alive and server.compile(_jobs(1)) is None
    deadline = time.monotonic() + 10
    while _group_alive(pgid) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not _group_alive(pgid), "the server or its workers were left running"


@pytest.mark.parametrize("workers", [1, 3])
def test_server_results_come_back_per_job_in_order(monkeypatch, workers):
    from fireclay_triton import compile_server

    monkeypatch.setattr(compile_server, "_compile_spec", _fail_or_compile)
    server = compile_server.CompileServer(target=None, workers=workers)
    try:
        for n in (5, 1, 4):  # several requests to one server, each answered in order
            found = server.compile(_jobs(n))
            assert found == [(None, None) if i % 2 == 0 else (f"k{i}: failed", None) for i in range(n)]
    finally:
        server.stop()
    assert not server.alive


def test_a_broken_server_is_not_restarted(monkeypatch):
    from fireclay_triton import compile_server

    compile_server.stop_all()
    monkeypatch.setattr(compile_server, "_compile_spec", _hang)
    monkeypatch.setattr(compile_server, "TIMEOUT_S", 1.0)
    try:
        first = compile_server.server(("target", 1), 2)
        assert first is not None and compile_server.server(("target", 1), 2) is first
        assert first.compile(_jobs(1)) is None
        assert compile_server.server(("target", 1), 2) is None
    finally:
        compile_server.stop_all()


@pytest.mark.parametrize("env,workers,expected", [
    (None, 16, "processes"), (None, 2, "threads"), (None, 4, "processes"),
    ("threads", 16, "threads"), ("processes", 2, "processes"), ("bogus", 16, "processes"),
])
def test_compile_pool_choice(monkeypatch, env, workers, expected):
    import fireclay_triton
    from fireclay_triton.precompile import pool_kind

    monkeypatch.setattr(fireclay_triton.config, "compile_pool", env or "")
    assert pool_kind(workers) == expected
