"""A sweep over every base architecture transformers ships, each at a tiny size.

    python -m benchmarks.sweep --jobs 2 [--device cpu|cuda] [--dtype float32|bfloat16]
        [--mode inference|training] [--only name,...] [--limit N] [--timeout S] [--out DIR]

For each entry of ``transformers.models.auto.modeling_auto.MODEL_MAPPING_NAMES`` the sweep builds
the model from its default config made tiny (``sweep_models.shrink_config``), with random
weights, finds inputs eager accepts, and records, in a process of its own (forked from this one,
killed after ``--timeout`` seconds):

- whether ``fireclay.compile(model)(...)`` matches eager on every output (nested outputs
  flattened; a model whose eager outputs change with the random seed is compared by shape);
- fireclay's graphs, graph breaks and frames that ran eagerly (with the reason), and graphs that
  ran in an interpreter because a later stage failed (from the warnings);
- any exception that escaped ``fireclay.compile(model)(...)``, with the stage it came from;
- TorchDynamo's graph and break counts on the same model and inputs (a counting backend);
- time of each part.

Results go to ``<out>/sweep-<device>-<dtype>-<mode>-<YYYYmmdd-HHMM>.json`` and ``.md``, rewritten
after every architecture, so an interrupted sweep keeps what it measured. Architectures eager
itself cannot run at the tiny size are listed as skipped with eager's error.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import multiprocessing.connection
import os
import signal
import sys
import time
from typing import Any

from benchmarks.sweep_report import Outcome, write_results

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def architectures() -> list[tuple[str, str]]:
    """(model type, base model class name) of every base architecture, in the mapping's order."""
    from transformers.models.auto.modeling_auto import MODEL_MAPPING_NAMES

    out = []
    for model_type, class_name in MODEL_MAPPING_NAMES.items():
        if isinstance(class_name, (list, tuple)):
            class_name = class_name[0]
        out.append((model_type, class_name))
    return out


def _child(conn: Any, model_type: str, class_name: str, options: dict[str, Any]) -> None:
    os.setpgrp()  # a timeout kills the compilers this process started too
    from benchmarks.sweep_run import run_architecture

    try:
        outcome = run_architecture(model_type, class_name, **options)
    except BaseException as exc:  # noqa: BLE001 - the harness itself failed on this model
        import traceback

        outcome = Outcome(model_type, class_name, status="harness-error",
                          reason=f"{type(exc).__name__}: {exc}", detail=traceback.format_exc()[-3000:])
    conn.send(outcome.to_json())
    conn.close()


def _kill(process: multiprocessing.Process) -> None:
    try:
        os.killpg(process.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        process.kill()
    process.join(5)


def sweep(archs: list[tuple[str, str]], options: dict[str, Any], jobs: int, timeout: float, out_base: str,
          meta: dict[str, Any], carried: list[Outcome] = (), deadline: float | None = None) -> list[Outcome]:
    """Run every architecture in a forked process, ``jobs`` at a time; write results as they come.

    ``carried`` outcomes (from an earlier, interrupted sweep) are written with the new ones. After
    ``deadline`` seconds the architectures still running are stopped and, with those not started,
    left out of the results (``meta["not_run"]`` names them), so a resumed sweep runs them.
    """
    ctx = multiprocessing.get_context("fork")
    pending = list(archs)
    running: dict[Any, tuple[multiprocessing.Process, str, str, float]] = {}
    outcomes: list[Outcome] = list(carried)
    total = len(archs) + len(outcomes)
    stop_at = None if deadline is None else time.monotonic() + deadline
    while pending or running:
        if stop_at is not None and time.monotonic() > stop_at:
            for process, _, _, _ in running.values():
                _kill(process)
            meta["not_run"] = sorted([m for _, m, _, _ in running.values()] + [m for m, _ in pending])
            print(f"deadline reached: {len(meta['not_run'])} architectures not run", flush=True)
            break
        while pending and len(running) < jobs:
            model_type, class_name = pending.pop(0)
            parent, child = ctx.Pipe(duplex=False)
            process = ctx.Process(target=_child, args=(child, model_type, class_name, options), daemon=False)
            process.start()
            child.close()
            running[parent] = (process, model_type, class_name, time.monotonic())
        ready = multiprocessing.connection.wait(list(running), timeout=1.0)
        now = time.monotonic()
        for conn in list(running):
            process, model_type, class_name, started = running[conn]
            outcome = None
            if conn in ready:
                try:
                    outcome = Outcome.from_json(conn.recv())
                except (EOFError, OSError):
                    process.join(5)
                    outcome = Outcome(model_type, class_name, status="crashed",
                                      reason=f"the process died (exit code {process.exitcode})")
                process.join(30)
            elif now - started > timeout:
                _kill(process)
                outcome = Outcome(model_type, class_name, status="timeout", reason=f"no result within {timeout:.0f} s")
            if outcome is None:
                continue
            if not outcome.seconds:
                outcome.seconds = round(now - started, 2)
            del running[conn]
            conn.close()
            outcomes.append(outcome)
            print(f"[{len(outcomes)}/{total}] {model_type:32s} {outcome.summary_line()}", flush=True)
            write_results(out_base, outcomes, meta)
    return outcomes


def _warm_up(dynamo: bool) -> None:
    """Compile a toy model once with each system, so that their lazy imports are paid here, once,
    and not in every forked model process."""
    import threading

    import torch

    import fireclay

    toy = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.LayerNorm(4))
    with torch.no_grad():
        fireclay.compile(toy)(torch.randn(2, 4))
    if dynamo:
        import torch._dynamo

        torch.compile(toy, backend=lambda gm, example_inputs: gm.forward)(torch.randn(2, 4))
        torch._dynamo.reset()
    fireclay.reset()
    if threading.active_count() > 1:
        print(f"note: {threading.active_count()} threads alive before forking the model processes", flush=True)


def _environment(args: argparse.Namespace) -> dict[str, Any]:
    import platform

    import torch
    import transformers

    from benchmarks.report import git_commit

    commit = git_commit() or ""
    return {"device": args.device, "dtype": args.dtype, "mode": args.mode, "jobs": args.jobs,
            "timeout_s": args.timeout, "torch": torch.__version__, "transformers": transformers.__version__,
            "python": platform.python_version(), "machine": platform.processor() or platform.machine(),
            "cpus": os.cpu_count(), "commit": commit, "started": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
            "load_average_at_start": list(os.getloadavg()), "command": " ".join(sys.argv)}


def _resumed(args: argparse.Namespace, parser: argparse.ArgumentParser) -> tuple[list[Outcome], list[str]]:
    """The outcomes kept from the ``--resume`` files, and a line per file saying where they came from."""
    carried: dict[str, Outcome] = {}
    sources = []
    for path in [p.strip() for p in args.resume.split(",") if p.strip()]:
        try:
            with open(path) as f:
                data = json.load(f)
        except (OSError, ValueError) as exc:
            parser.error(f"--resume {path}: cannot read it as a sweep's results ({exc})")
        meta = data.get("meta", {})
        for key in ("device", "dtype", "mode"):
            theirs = str(meta.get(key, "")).split(":")[0]
            if theirs != str(getattr(args, key)).split(":")[0]:
                parser.error(f"--resume {path}: a sweep with {key} {meta.get(key)!r}, not {getattr(args, key)!r}")
        kept = [Outcome.from_json(r) for r in data.get("results", [])]
        kept = [o for o in kept if o.status not in ("timeout", "crashed", "harness-error")]
        for o in kept:
            carried[o.model_type] = o
        sources.append(f"{os.path.basename(path)} (commit {meta.get('commit', '?')}): {len(kept)} results")
    return list(carried.values()), sources


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.sweep", description=__doc__.split("\n\n")[0])
    parser.add_argument("--jobs", type=int, default=2)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--dtype", choices=("float32", "bfloat16"), default="float32")
    parser.add_argument("--mode", choices=("inference", "training"), default="inference")
    parser.add_argument("--only", default="", help="comma-separated model types (keys of MODEL_MAPPING_NAMES)")
    parser.add_argument("--skip", default="", help="comma-separated model types to leave out")
    parser.add_argument("--limit", type=int, default=None, help="the first N architectures only")
    parser.add_argument("--start", type=int, default=0, help="start at the N-th architecture")
    parser.add_argument("--timeout", type=float, default=300.0, help="seconds per architecture")
    parser.add_argument("--no-dynamo", action="store_true", help="skip TorchDynamo's graph count")
    parser.add_argument("--threads", type=int, default=1, help="torch CPU threads per model process")
    parser.add_argument("--out", default=os.path.join(REPO_ROOT, "benchmarks", "results"))
    parser.add_argument("--resume", default="",
                        help="comma-separated results files of earlier sweeps (same device, dtype and mode): "
                             "their results are kept and only the other architectures run (timeouts, crashes "
                             "and harness errors run again)")
    parser.add_argument("--deadline", type=float, default=None,
                        help="seconds: stop there and write what finished (resume it with --resume)")
    args = parser.parse_args(argv)

    # No network: a config that names files on the Hugging Face hub fails at once instead of retrying.
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    # Each model process compiles its GPU kernels in a pool as large as the machine: with --jobs
    # of them at once (12 x 32 workers on the first 32-core GPU run), every process stalled.
    os.environ.setdefault("FIRECLAY_TRITON_COMPILE_THREADS", str(max(1, (os.cpu_count() or 1) // max(1, args.jobs))))
    # Imported once here, so every forked model process starts with them loaded.
    import torch  # noqa: F401
    import torch._dynamo  # noqa: F401
    import transformers  # noqa: F401

    import fireclay  # noqa: F401

    torch.set_num_threads(args.threads)  # before any op: no thread pool exists when the children fork
    # TorchDynamo saves the CUDA random state around every compile, which initializes CUDA, and a
    # forked child cannot use CUDA after its parent initialized it: on a GPU only fireclay warms up.
    on_gpu = not args.device.startswith("cpu")
    _warm_up(dynamo=not args.no_dynamo and not on_gpu)
    if on_gpu and torch.cuda.is_initialized():
        raise SystemExit("the sweep initialized CUDA before forking its model processes; they could not use the GPU")
    archs = architectures()
    if args.only:
        wanted = [a.strip() for a in args.only.split(",") if a.strip()]
        known = dict(archs)
        unknown = [w for w in wanted if w not in known]
        if unknown:
            parser.error(f"not in MODEL_MAPPING_NAMES: {', '.join(unknown)}")
        archs = [(w, known[w]) for w in wanted]
    skip = {a.strip() for a in args.skip.split(",") if a.strip()}
    archs = [a for a in archs if a[0] not in skip][args.start:]
    if args.limit is not None:
        archs = archs[:args.limit]
    carried, resumed_from = _resumed(args, parser)
    done = {o.model_type for o in carried}
    archs = [a for a in archs if a[0] not in done]
    stamp = time.strftime("%Y%m%d-%H%M", time.gmtime())
    os.makedirs(args.out, exist_ok=True)
    out_base = os.path.join(args.out, f"sweep-{args.device.split(':')[0]}-{args.dtype}-{args.mode}-{stamp}")
    options = {"device": args.device, "dtype": args.dtype, "mode": args.mode, "dynamo": not args.no_dynamo,
               "threads": args.threads}
    meta = _environment(args)
    meta["architectures_selected"] = len(archs) + len(carried)
    if resumed_from:
        meta["resumed_from"] = resumed_from
    print(f"sweep of {len(archs)} architectures ({len(carried)} carried over) -> {out_base}.{{json,md}}", flush=True)
    outcomes = sweep(archs, options, args.jobs, args.timeout, out_base, meta, carried, args.deadline)
    meta["finished"] = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    meta["load_average_at_end"] = list(os.getloadavg())
    write_results(out_base, outcomes, meta)
    print(json.dumps({"json": out_base + ".json", "md": out_base + ".md"}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
