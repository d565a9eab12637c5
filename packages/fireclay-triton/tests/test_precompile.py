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
    return json.loads(done.stdout.strip().splitlines()[-1])


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


def test_forked_workers_compile_and_name_a_kernel_that_does_not_compile(tmp_path):
    found = _target_compile("p2", ["split", "broken"], tmp_path / "a", tmp_path / "ta")
    assert len(found["failures"]) == 1 and found["failures"][0].startswith("broken_kernel: CompilationError")
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


def _hang(index):  # a forked worker that never finishes
    import time

    time.sleep(60)


def _fail_or_compile(index):  # even jobs compile, odd ones fail
    return (None if index % 2 == 0 else f"job{index}: failed"), None


def test_a_stuck_forked_pool_is_stopped_and_reported_as_broken(monkeypatch):
    import multiprocessing
    import time

    from fireclay_triton import precompile

    monkeypatch.setattr(precompile, "_compile_forked", _hang)
    monkeypatch.setattr(precompile, "FORKED_TIMEOUT_S", 1.0)
    jobs = [precompile.CompileJob(f"k{i}", None, (i,), ()) for i in range(3)]
    start = time.monotonic()
    assert precompile._forked_compile(jobs, target=None, workers=2) is None  # the caller compiles in-process
    assert time.monotonic() - start < 30
    deadline = time.monotonic() + 10
    while multiprocessing.active_children() and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not multiprocessing.active_children(), "the stuck workers were left running"


def test_forked_results_come_back_per_job(monkeypatch):
    from fireclay_triton import precompile

    monkeypatch.setattr(precompile, "_compile_forked", _fail_or_compile)
    jobs = [precompile.CompileJob(f"k{i}", None, (i,), ()) for i in range(5)]
    found = precompile._forked_compile(jobs, target=None, workers=2)
    assert [found[j][0] for j in jobs] == [None, "job1: failed", None, "job3: failed", None]


@pytest.mark.parametrize("env,workers,jobs,expected", [
    (None, 16, 10, "processes"), (None, 2, 10, "threads"), (None, 16, 1, "threads"),
    ("threads", 16, 10, "threads"), ("processes", 2, 10, "processes"), ("bogus", 16, 10, "processes"),
])
def test_compile_pool_choice(monkeypatch, env, workers, jobs, expected):
    from fireclay_triton.precompile import pool_kind

    if env is None:
        monkeypatch.delenv("FIRECLAY_TRITON_COMPILE_POOL", raising=False)
    else:
        monkeypatch.setenv("FIRECLAY_TRITON_COMPILE_POOL", env)
    assert pool_kind(workers, jobs) == expected
