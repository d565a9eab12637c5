"""Run the benchmark suite: every model on every backend, numbers side by side.

    python -m benchmarks.run --backends eager,inductor,fireclay --device cpu --suite quick \
        --mode inference [--models a,b] [--preset small|medium|large] [--dtype bfloat16 | --amp bfloat16]
        [--out DIR]

Writes <out>/<device>-<suite>-<mode>-<preset>[-<dtype>]-<UTC date and time>.{json,md} and prints one
progress line per model and backend. A model that fails is reported with its reason; the run
goes on. See benchmarks/README.md for what each column means.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import glob
import json
import os
import shlex
import subprocess
import sys
import tempfile
import time

from benchmarks.backends import ALL_CACHE_ENV, get_backend
from benchmarks.measure import DTYPES, MODES, Precision, make_rss_track_tensors
from benchmarks.models import COLD_LIMITS, PRESETS, SUITES, all_models, suite_models
from benchmarks.report import claim_stem, environment, load_average, progress_line, write
from benchmarks.runner import METRICS, REPO_ROOT, Cell, Options, bench_model, precision_args, prime

DEFAULT_OUT = os.path.join(REPO_ROOT, "benchmarks", "results")


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.run", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--backends", default="eager,inductor,fireclay",
                        help="comma-separated backend names (eager is always added first)")
    parser.add_argument("--device", default="cpu", help="cpu or cuda (or cuda:N)")
    parser.add_argument("--suite", choices=sorted(SUITES), help="default: quick on cpu, gpu (the hf suite and "
                        "the zoo) on cuda")
    parser.add_argument("--mode", default="inference", choices=MODES)
    parser.add_argument("--models", default="", help="comma-separated model names (any model of the suite "
                        "registry, in the given order); overrides the suite's list")
    parser.add_argument("--preset", choices=PRESETS, help="model sizes: small (default on cpu), medium "
                        "(4 layers x 256 wide, tens of ms per eager call on a CPU) or large (default on cuda)")
    parser.add_argument("--dtype", default="float32", choices=DTYPES, help="weights and floating inputs in "
                        "this dtype (what people run on GPUs: bfloat16)")
    parser.add_argument("--amp", choices=DTYPES[1:], help="float32 weights, the forward under torch.autocast "
                        "in this dtype")
    parser.add_argument("--out", default=DEFAULT_OUT, help="directory for the JSON and Markdown results")
    parser.add_argument("--repeats", type=int, default=10, help="interleaved timing samples per backend")
    parser.add_argument("--skip", default="", help=f"metrics to leave out, comma-separated: {','.join(METRICS)}")
    parser.add_argument("--threads", type=int, help="torch CPU threads (default: torch's own choice); a shared "
                        "or loaded machine gives steadier numbers with 1")
    parser.add_argument("--clock", choices=("wall", "cpu"), default="wall", help="what timing samples read: wall "
                        "time, or the process's CPU time (with --threads 1 on a loaded machine: the time other "
                        "processes hold the core is left out)")
    parser.add_argument("--cold-limit", type=int, help="measure cold compiles on the first N models only "
                        "(default: all, except the quick suite: 2)")
    parser.add_argument("--cold-timeout", type=float, default=600.0, help="seconds per cold-compile process")
    parser.add_argument("--isolate", action="store_true", help="run each model in its own process, so that a "
                        "crash or hang of one model (segfault, runaway compile) cannot stop the run")
    parser.add_argument("--model-timeout", type=float, default=1800.0, help="seconds per model with --isolate")
    parser.add_argument("--list", action="store_true", help="list the models and suites, then exit")
    return parser.parse_args(argv)


def _list_models() -> None:
    for name, spec in all_models().items():
        missing = spec.missing()
        print(f"{name:<22} {spec.family:<16} {spec.description}"
              + (f"  [needs {', '.join(missing)}]" if missing else ""))
    for suite, names in SUITES.items():
        print(f"suite {suite}: {', '.join(names())}")


def _fresh_caches() -> tempfile.TemporaryDirectory | None:
    """Point the compilers' on-disk caches at a new directory for this run, unless the caller set
    them: the first compile of a model in this run then starts from empty disk caches, and the
    warm compile sees exactly what that first compile left."""
    if any(variable in os.environ for variable in ALL_CACHE_ENV):
        return None
    root = tempfile.TemporaryDirectory(prefix="fireclay-bench-")
    for variable in ALL_CACHE_ENV:
        os.environ[variable] = os.path.join(root.name, variable.lower())
    return root


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.list:
        _list_models()
        return 0
    import torch

    if args.device.startswith("cuda") and not torch.cuda.is_available():
        print("error: --device cuda asked for, but torch sees no CUDA device", file=sys.stderr)
        return 2
    preset = args.preset or ("small" if args.device == "cpu" else "large")
    args.suite = args.suite or ("quick" if args.device == "cpu" else "gpu")
    try:
        precision = Precision(args.dtype, args.amp)
    except ValueError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    skip = {m for m in args.skip.split(",") if m}
    if skip - set(METRICS):
        print(f"error: unknown metrics in --skip: {', '.join(sorted(skip - set(METRICS)))}", file=sys.stderr)
        return 2
    names = [n for n in args.backends.split(",") if n]
    backend_names = ["eager"] + [n for n in names if n != "eager"]
    try:
        backends = [get_backend(n) for n in backend_names]
        specs = ([all_models()[n] if n in all_models() else _unknown(n) for n in args.models.split(",") if n]
                 if args.models else suite_models(args.suite))
    except KeyError as error:
        print(f"error: {error.args[0]}", file=sys.stderr)
        return 2

    caches = _fresh_caches()
    make_rss_track_tensors()
    if args.threads:
        torch.set_num_threads(args.threads)
    options = Options(device=args.device, mode=args.mode, preset=preset, repeats=args.repeats,
                      metrics=tuple(m for m in METRICS if m not in skip), cold_timeout_s=args.cold_timeout,
                      threads=args.threads, precision=precision, clock=args.clock)
    started = datetime.datetime.now(datetime.UTC)
    meta = {"suite": args.suite, "mode": args.mode, "device": args.device, "preset": preset,
            "dtype": precision.dtype, "amp": precision.amp,
            "backends": backend_names, "repeats": args.repeats, "clock": args.clock, "metrics": list(options.metrics),
            "date": started.strftime("%Y-%m-%d %H:%M"),
            "command": "python -m benchmarks.run " + shlex.join(sys.argv[1:] if argv is None else argv),
            "environment": environment(args.device)}
    device_tag = "cuda" if args.device.startswith("cuda") else args.device
    stem = claim_stem(args.out, f"{device_tag}-{args.suite}-{args.mode}-{preset}{precision.tag}-"
                                f"{started.strftime('%Y%m%d-%H%M')}")
    print(f"benchmarking {len(specs)} models x {len(backends)} backends ({', '.join(backend_names)}), "
          f"{args.mode}, {args.device}, preset {preset}, {precision.amp and 'autocast ' + precision.amp or precision.dtype}",
          flush=True)

    if not args.isolate:
        for backend in backends:
            prime(backend, options)
    cold_limit = args.cold_limit if args.cold_limit is not None else (
        None if args.models else COLD_LIMITS.get(args.suite))
    meta["cold_limit"] = cold_limit
    cells = []
    wall = time.perf_counter()
    for index, spec in enumerate(specs, 1):
        print(f"[{index}/{len(specs)}] {spec.name} ...", flush=True)
        begun = time.perf_counter()
        try:
            model_options = options
            if cold_limit is not None and index > cold_limit:
                model_options = dataclasses.replace(options, metrics=tuple(m for m in options.metrics if m != "cold"))
            if args.isolate:
                model_cells = _bench_in_subprocess(spec, backend_names, args, preset, model_options)
            else:
                model_cells = bench_model(spec, backends, model_options)
        except Exception as error:  # the harness itself must never stop the run
            model_cells = [Cell(spec.name, spec.family, name) for name in backend_names]
            for cell in model_cells:
                cell.fail("harness", error)
        for cell in model_cells:
            print(progress_line(index, len(specs), cell), flush=True)
        print(f"[{index}/{len(specs)}] {spec.name} done in {time.perf_counter() - begun:.1f}s", flush=True)
        cells += model_cells
        # Written after every model so that an interrupted run keeps what it measured.
        meta["wall_s"] = round(time.perf_counter() - wall, 1)
        meta["load_average_at_end"] = load_average()
        json_path, md_path = write(args.out, stem, meta, cells, backend_names)
    if caches is not None:
        caches.cleanup()
    if cells:
        print(f"wrote {md_path}\nwrote {json_path}  ({meta['wall_s']:.0f}s)")
    return 0


def _bench_in_subprocess(spec, backend_names: list[str], args, preset: str, options: Options) -> list[Cell]:
    """One model in a child `python -m benchmarks.run --models NAME`, its cells read back from the
    JSON it writes; a child that crashes or outlives --model-timeout fails that model alone."""
    with tempfile.TemporaryDirectory(prefix="fireclay-bench-model-") as out:
        command = [sys.executable, "-m", "benchmarks.run", "--models", spec.name, "--suite", args.suite,
                   "--backends", ",".join(backend_names), "--device", args.device, "--mode", args.mode,
                   "--preset", preset, "--repeats", str(args.repeats), "--clock", args.clock,
                   "--cold-timeout", str(args.cold_timeout),
                   *precision_args(options.precision), "--out", out, "--skip", ",".join(m for m in METRICS if m not in options.metrics),
                   *(["--threads", str(args.threads)] if args.threads else [])]
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [REPO_ROOT, env.get("PYTHONPATH")]))
        reason = None
        try:
            done = subprocess.run(command, cwd=REPO_ROOT, env=env, capture_output=True, text=True,
                                  timeout=args.model_timeout)
        except subprocess.TimeoutExpired:
            reason = f"isolated run: no result within {args.model_timeout:.0f} s"
        else:
            results = glob.glob(os.path.join(out, "*.json"))
            if results:
                with open(results[0]) as file:
                    return [Cell(**cell) for cell in json.load(file)["cells"]]
            tail = (done.stderr.strip().splitlines() or ["no output"])[-1]
            reason = f"isolated run: the process died (exit {done.returncode}): {tail[:300]}"
    cells = [Cell(spec.name, spec.family, name) for name in backend_names]
    for cell in cells:
        cell.status, cell.reason = "error", reason
    return cells


def _unknown(name: str):
    raise KeyError(f"unknown model {name!r}; `python -m benchmarks.run --list` shows the models")


if __name__ == "__main__":
    raise SystemExit(main())
