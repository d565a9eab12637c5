"""Cold and warm compile time of a few models, fireclay (and with ``--inductor`` torch.compile).

    python benchmarks/compile_time.py [--models bert,mlp,cnn_bn] [--inductor]

Every measurement runs in a fresh subprocess. *Cold*: every cache folder (FIRECLAY_CACHE_DIR,
TRITON_CACHE_DIR, TORCHINDUCTOR_CACHE_DIR) new and empty; *warm*: a second process on the
folders the cold one filled.

On a CUDA GPU the time is end to end: the compile call and the first call of the compiled model in inference mode
(capture, autograd, loops, Triton code generation, compiling every kernel and every autotuning
config, autotuning, one run), like benchmarks/ "first compile s". fireclay compiles the kernels
in the background by default (the first call runs in its interpreter): ``cold s`` is then the
time to the first output and ``compiled s`` the time until the compiled kernels ran (after
``fireclay.wait_compiled()``, a second call); ``FIRECLAY_BACKGROUND_COMPILE=0`` measures the
compile before the first output as before. Without a GPU only our part can
be measured: the models' Triton kernels (every config the first call would try) compiled for an
sm_90 target (``triton.compile`` with its bundled ptxas); the model itself runs in fireclay's
interpreter. The ``ahead`` columns are the seconds spent compiling kernels ahead (wall clock, on
``threads`` workers) and the number of kernel/config compilations; ``--pools threads,processes``
measures fireclay with each compile pool (``FIRECLAY_TRITON_COMPILE_POOL``; ``auto``: the default). ``--profile N``
prints, for each cold fireclay measurement, the N functions of its main thread with the largest
cumulative time (cProfile), to see which stage the seconds go to; ``--timeline`` prints, for each
cold fireclay measurement, when each stage started and ended on which thread (seconds from the
compile call).
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.abspath(os.path.join(HERE, ".."))  # the repository, whose benchmarks/ holds the models
CACHE_ENV = ("FIRECLAY_CACHE_DIR", "TRITON_CACHE_DIR", "TORCHINDUCTOR_CACHE_DIR")


def _profiled(fn, top: int):
    """``fn()`` under cProfile; its top functions by cumulative time go to stderr."""
    import cProfile
    import io
    import pstats

    profiler = cProfile.Profile()
    result = profiler.runcall(fn)
    out = io.StringIO()
    pstats.Stats(profiler, stream=out).sort_stats("cumulative").print_stats(top)
    print(out.getvalue(), file=sys.stderr)
    return result


# (module, attribute) of the stages --timeline shows; a dotted attribute is a method of a class
TIMELINE_STAGES = (
    ("fireclay_capture.api", "CapturedFunction._capture"),
    ("fireclay.backends.builtin", "compile_program"),
    ("fireclay.backends.builtin", "scheduled_program"),
    ("fireclay_triton", "compile_program"),
    ("fireclay_triton.api", "_compile_ahead"),
    ("fireclay_triton.compile_server", "CompileServer.compile"),
    ("fireclay_triton.compile_server", "_warm_up"),
    ("fireclay_triton.compile_server", "_compile_spec"),
    ("triton.runtime.cache", "triton_key"),
    ("triton", "compile"),
    ("fireclay_triton.warmup", "_work"),
    ("fireclay_triton.runtime", "Launcher._tune"),
    ("fireclay.tiered", "TieredGraph._switch"),
)


def _record_timeline(events: list, origin: list) -> None:
    """Wrap each of TIMELINE_STAGES so that its calls append (thread, stage, start, end) to
    ``events``, in seconds from ``origin[0]``; calls in forked processes (the compile server and
    its workers) print their line to stderr at once, their process id for the thread."""
    import importlib
    import threading

    pid = os.getpid()

    def timed_stage(fn, label):
        @functools.wraps(fn)
        def wrapper(*args, **kwargs):
            start = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                end = time.perf_counter()
                if os.getpid() == pid:
                    events.append((threading.current_thread().name, label, start - origin[0], end - origin[0]))
                else:
                    print(_timeline_line((f"process {os.getpid()}", label, start - origin[0], end - origin[0])),
                          file=sys.stderr, flush=True)
        return wrapper

    for module_name, attr in TIMELINE_STAGES:
        owner = importlib.import_module(module_name)
        *path, name = attr.split(".")
        for part in path:
            owner = getattr(owner, part)
        setattr(owner, name, timed_stage(getattr(owner, name), f"{module_name}.{attr}"))


def _timeline_line(event: tuple) -> str:
    thread, stage, start, end = event
    return f"{start:7.3f} {end:7.3f} {end - start:7.3f}  {thread:32.32} {stage}"


def _child(model: str, backend: str, preset: str, threads: int | None, timeline: bool = False) -> dict:
    """One measurement, in this (fresh) process; returns what the parent prints."""
    sys.path.insert(0, ROOT)
    import torch

    from benchmarks.measure import Step, fresh_copy, run_until_compiled, timed
    from benchmarks.models import get_model

    gpu = torch.cuda.is_available()
    if threads:
        import fireclay_triton

        fireclay_triton.config.compile_threads = threads
    built = get_model(model).build(preset)
    device = "cuda" if gpu else "cpu"
    inputs = built.inputs(1, device)
    module = fresh_copy(built.module, device)
    import fireclay  # imported untimed, like torch; each backend's compile call is timed

    events: list = []
    origin = [0.0]
    if timeline and backend != "inductor":
        _record_timeline(events, origin)

    def wrap():
        origin[0] = time.perf_counter()
        if backend == "inductor":
            return torch.compile(module)  # imports TorchDynamo
        return fireclay.compile(module) if gpu else fireclay.compile(module, backend=_target_only_backend())

    wrap_s, compiled = timed(wrap, device)
    step = Step(compiled, module, "inference")
    seconds, _ = timed(lambda: step(inputs), device)
    seconds += wrap_s
    compiled_s = seconds
    if backend != "inductor":
        import fireclay

        settle_s, _ = timed(lambda: run_until_compiled(lambda: step(inputs), fireclay.wait_compiled), device)
        compiled_s += settle_s
    for event in sorted(events, key=lambda e: e[2]):
        print(_timeline_line(event), file=sys.stderr)
    from fireclay_triton import precompile

    return {"seconds": seconds, "compiled_s": compiled_s, "ahead_s": precompile.TOTALS["seconds"],
            "jobs": precompile.TOTALS["jobs"],
            "failures": precompile.TOTALS["failures"], "threads": precompile.default_workers(),
            "device": torch.cuda.get_device_name() if gpu else "cpu (sm_90 target only)"}


def _target_only_backend():
    """A fireclay backend for a machine without a GPU: each aten graph goes through loops and
    Triton code generation, its kernels are compiled for sm_90, and it then runs in the interpreter."""
    from triton.backends.compiler import GPUTarget

    from fireclay_autograd import compile_program, interpreter_backend
    from fireclay_triton import Config
    from fireclay_triton import compile_program as triton_compile
    from fireclay_triton.api import program_compile_jobs
    from fireclay_triton.precompile import compile_for_target

    def codegen(program, example_inputs):
        compiled = triton_compile(program, example_inputs, cfg=Config(autotune=True))
        report = compile_for_target(program_compile_jobs(compiled), GPUTarget("cuda", 90, 32))
        for failure in report.failures:
            print("compile failure:", failure, file=sys.stderr)
        return interpreter_backend(program, example_inputs)

    return functools.partial(compile_program, fw_compiler=codegen, bw_compiler=codegen)


def _measure(model: str, backend: str, preset: str, caches: dict[str, str], threads: int | None,
             profile: int = 0, timeline: bool = False) -> dict:
    env = dict(os.environ, **caches)
    backend, _, pool = backend.partition("/")
    if pool and pool != "auto":
        env["FIRECLAY_TRITON_COMPILE_POOL"] = pool
    env.pop("TRITON_INTERPRET", None)
    env["PYTHONPATH"] = os.pathsep.join([ROOT, env.get("PYTHONPATH", "")])
    cmd = [sys.executable, os.path.abspath(__file__), "--child", model, "--backend", backend, "--preset", preset]
    if threads:
        cmd += ["--threads", str(threads)]
    if profile:
        cmd += ["--profile", str(profile)]
    if timeline:
        cmd += ["--timeline"]
    start = time.perf_counter()
    done = subprocess.run(cmd, env=env, capture_output=True, text=True)
    wall = time.perf_counter() - start
    if profile or timeline:
        print(f"-- profile of {model} on {backend}/{env.get('FIRECLAY_TRITON_COMPILE_POOL', 'threads')}", file=sys.stderr)
        print(done.stderr, file=sys.stderr)
    lines = done.stdout.strip().splitlines()
    if done.returncode != 0 or not lines:
        return {"error": (done.stderr.strip().splitlines() or ["no output"])[-1][:120], "process_s": wall}
    return dict(json.loads(lines[-1]), process_s=wall)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", default="bert,mlp,cnn_bn")
    parser.add_argument("--preset", default=None, help="the models' size: small, medium or large (default: "
                        "large on a GPU, small without one)")
    parser.add_argument("--inductor", action="store_true", help="torch.compile (Inductor) too, on a GPU")
    parser.add_argument("--threads", type=int, help="compile workers (default: the CPU count)")
    parser.add_argument("--pools", default="auto",
                        help="fireclay's compile pools to measure, comma-separated: auto (its default), threads, processes")
    parser.add_argument("--profile", type=int, default=0, help="print each cold fireclay child's top N functions")
    parser.add_argument("--timeline", action="store_true",
                        help="print each cold fireclay child's stages: start, end, seconds, thread")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    parser.add_argument("--backend", default="fireclay", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    import torch

    gpu = torch.cuda.is_available()
    preset = args.preset or ("large" if gpu else "small")
    if args.child:
        measure = functools.partial(_child, args.child, args.backend, preset, args.threads, args.timeline)
        print(json.dumps(_profiled(measure, args.profile) if args.profile else measure()))
        return 0
    backends = [f"fireclay/{pool}" for pool in args.pools.split(",")] + (["inductor"] if args.inductor and gpu else [])
    print(f"compile time, preset {preset}, inference; cold = empty caches, warm = a second process on them")
    print("| model | backend | device | cold s | cold compiled s | warm s | ahead s cold/warm (threads) "
          "| jobs cold/warm |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- |")
    for model in args.models.split(","):
        for backend in backends:
            with tempfile.TemporaryDirectory(prefix="compile-time-") as tmp:
                caches = {name: os.path.join(tmp, name.lower()) for name in CACHE_ENV}
                ours = backend.startswith("fireclay")
                cold = _measure(model, backend, preset, caches, args.threads, args.profile if ours else 0,
                                args.timeline and ours)
                warm = _measure(model, backend, preset, caches, args.threads)
            if "error" in cold or "error" in warm:
                print(f"| {model} | {backend} | | failed: {cold.get('error') or warm.get('error')} | | | | |")
                continue
            ahead = f"{cold['ahead_s']:.2f}/{warm['ahead_s']:.2f} ({cold['threads']})" if ours else "-"
            jobs = f"{cold['jobs']}/{warm['jobs']}" if ours else "-"
            print(f"| {model} | {backend} | {cold['device']} | {cold['seconds']:.2f} | {cold['compiled_s']:.2f} "
                  f"| {warm['seconds']:.2f} | {ahead} | {jobs} |", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
