"""Where the time of one compiled call goes: the median wall time per step of each backend, then
a cProfile of the first non-eager backend's steps (top functions by own time).

    python -m benchmarks.profile_call --models mlp,bert --device cuda --backends eager,inductor,fireclay
    python -m benchmarks.profile_call --models mlp --mode training --tiny

``--tiny`` uses the smallest inputs of each model (batch 1, a few tokens), where per-call
overhead rather than kernel time dominates: the "tiny" column of ``benchmarks.run``. Wall times
are synchronised with the device after each batch of calls, so they include issuing every kernel.
"""

from __future__ import annotations

import argparse
import cProfile
import functools
import io
import pstats
import statistics
import time

import torch

from benchmarks.backends import get_backend
from benchmarks.measure import MODES, Step, fresh_copy, run_until_compiled, sync
from benchmarks.models import PRESETS, get_model


def per_step_ms(step: Step, inputs, device: str, calls: int = 30, repeats: int = 7) -> float:
    for _ in range(5):
        step(inputs)
    sync(device)
    samples = []
    for _ in range(repeats):
        start = time.perf_counter()
        for _ in range(calls):
            step(inputs)
        sync(device)
        samples.append((time.perf_counter() - start) / calls * 1e3)
    return statistics.median(samples)


def profile(step: Step, inputs, device: str, calls: int, top: int) -> str:
    profiler = cProfile.Profile()
    profiler.enable()
    for _ in range(calls):
        step(inputs)
    sync(device)
    profiler.disable()
    out = io.StringIO()
    stats = pstats.Stats(profiler, stream=out)
    stats.sort_stats("tottime").print_stats(top)
    stats.sort_stats("cumulative").print_stats(top)
    return out.getvalue()


def kernel_table(step: Step, inputs, device: str, calls: int, top: int) -> str:
    """torch.profiler's table of device time per kernel and op over ``calls`` steps."""
    activities = [torch.profiler.ProfilerActivity.CPU]
    if device.startswith("cuda"):
        activities.append(torch.profiler.ProfilerActivity.CUDA)
    with torch.profiler.profile(activities=activities) as prof:
        for _ in range(calls):
            step(inputs)
        sync(device)
    sort = "self_cuda_time_total" if device.startswith("cuda") else "self_cpu_time_total"
    return prof.key_averages().table(sort_by=sort, row_limit=top, max_name_column_width=70)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", default="mlp")
    parser.add_argument("--backends", default="eager,fireclay")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--mode", choices=MODES, default="inference")
    parser.add_argument("--preset", choices=PRESETS)
    parser.add_argument("--tiny", action="store_true")
    parser.add_argument("--threads", type=int)
    parser.add_argument("--profile-calls", type=int, default=50)
    parser.add_argument("--top", type=int, default=25)
    parser.add_argument("--profile", help="the backend to profile (default: the last one named)")
    parser.add_argument("--same-thread", action="store_true",
                        help="run autograd's backward on the calling thread (torch runs a CUDA backward on a thread "
                             "of its own, which cProfile does not see)")
    parser.add_argument("--kernels", action="store_true",
                        help="instead of cProfile, torch.profiler's device time per kernel, for every backend")
    args = parser.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    if args.same_thread:
        torch.autograd.set_multithreading_enabled(False)
    preset = args.preset or ("large" if args.device.startswith("cuda") else "small")
    backends = args.backends.split(",")
    for name in args.models.split(","):
        built = get_model(name).build(preset)
        inputs = built.inputs(0, args.device, tiny=args.tiny)
        times = {}
        steps = {}
        for b in backends:
            model = fresh_copy(built.module, args.device)
            backend = get_backend(b)
            step = steps[b] = Step(backend.compile(model), model, args.mode)
            step(inputs)
            run_until_compiled(functools.partial(step, inputs), backend.wait_compiled)  # kernels, not the interpreter
            times[b] = per_step_ms(steps[b], inputs, args.device)
        cells = "  ".join(f"{b} {t:.3f} ms" for b, t in times.items())
        print(f"== {name} ({args.mode}, {'tiny' if args.tiny else preset}, {args.device}): {cells}")
        if args.kernels:
            for b in backends:
                print(f"-- {b}")
                print(kernel_table(steps[b], inputs, args.device, 10, args.top))
            continue
        target = args.profile or backends[-1]
        if target in steps:
            print(profile(steps[target], inputs, args.device, args.profile_calls, args.top))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
