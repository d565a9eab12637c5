"""Where the time of one compiled call goes: the median wall time per step of each backend, then
a cProfile of the first non-eager backend's steps (top functions by own time).

    python -m benchmarks.profile_call --models mlp,bert --device cuda --backends eager,inductor,fireclay
    python -m benchmarks.profile_call --models mlp --mode training --tiny
    python -m benchmarks.profile_call --models bert --device cuda --dtype bfloat16 \
        --backends eager,inductor,fireclay --categories

``--categories`` prints each backend's device time per call by category (matmul, attention,
generated kernels, library pointwise/reduction, copies and layout changes, and the device's idle
time while the calls ran: large when the host cannot issue kernels as fast as the device runs
them) and, per category, how far each backend is from the fastest: where one loses.

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
from benchmarks.measure import DTYPES, MODES, Precision, Step, fresh_copy, run_until_compiled, sync
from benchmarks.models import PRESETS, get_model
from benchmarks.runner import Options

# Kernel-name fragments per category, tried in order (the first match wins).
CATEGORIES = (
    ("attention", ("flash", "fmha", "attention", "attn", "sdpa", "softmax_warp")),
    ("matmul", ("aten::mm", "aten::addmm", "aten::bmm", "aten::linear", "gemm", "cutlass", "xmma", "cublas", "wgmma", "nvjet", "matmul", "splitk", "_mma")),
    ("copies/layout", ("copy", "cat_", "catarray", "transpose", "permute", "contiguous", "fill")),
    ("library pointwise/reduction", ("at::native", "elementwise", "reduce_kernel", "vectorized")),
)
GENERATED = "generated kernels"
BETWEEN = "device idle (host-bound)"


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


def category_of(kernel: str) -> str:
    name = kernel.lower()
    for category, fragments in CATEGORIES:
        if any(fragment in name for fragment in fragments):
            return category
    return GENERATED


def device_categories(step: Step, inputs, device: str, calls: int) -> dict[str, float]:
    """Device milliseconds per call by category (CUDA kernels; on CPU, operators' own time), and
    on CUDA the device's idle time between the first kernel's start and the last one's end."""
    cuda = device.startswith("cuda")
    activities = [torch.profiler.ProfilerActivity.CPU] + ([torch.profiler.ProfilerActivity.CUDA] if cuda else [])
    step(inputs)
    sync(device)
    with torch.profiler.profile(activities=activities) as prof:
        for _ in range(calls):
            step(inputs)
        sync(device)
    totals: dict[str, float] = {}
    spans = []
    for event in prof.events():
        on_device = event.device_type == torch.autograd.DeviceType.CUDA
        if on_device != cuda or (not cuda and event.cpu_parent is not None):
            continue
        microseconds = event.device_time if cuda else event.self_cpu_time_total
        totals[category_of(event.name)] = totals.get(category_of(event.name), 0.0) + microseconds
        if cuda:
            spans.append((event.time_range.start, event.time_range.end))
    if spans:
        busy = sum(totals.values())
        totals[BETWEEN] = max(0.0, max(end for _, end in spans) - min(start for start, _ in spans) - busy)
    return {category: us / calls / 1e3 for category, us in totals.items()}


def category_table(per_backend: dict[str, dict[str, float]]) -> str:
    names = list(per_backend)
    categories = sorted({c for table in per_backend.values() for c in table},
                        key=lambda c: -max(t.get(c, 0.0) for t in per_backend.values()))
    lines = [f"{'category (device ms per call)':<32}" + "".join(f"{n:>12}" for n in names) + "   loses most"]
    for category in [*categories, "total"]:
        values = [sum(t.values()) if category == "total" else t.get(category, 0.0) for t in per_backend.values()]
        best = min(values)
        worst = names[values.index(max(values))]
        lines.append(f"{category:<32}" + "".join(f"{v:>12.3f}" for v in values)
                     + (f"   {worst} +{max(values) - best:.3f}" if max(values) - best > 0.005 else ""))
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", default="mlp")
    parser.add_argument("--backends", default="eager,fireclay")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--mode", choices=MODES, default="inference")
    parser.add_argument("--preset", choices=PRESETS, help="model sizes: small (default on cpu), medium or large "
                        "(default on cuda)")
    parser.add_argument("--tiny", action="store_true")
    parser.add_argument("--threads", type=int)
    parser.add_argument("--profile-calls", type=int, default=50)
    parser.add_argument("--top", type=int, default=25)
    parser.add_argument("--profile", help="the backend to profile (default: the last one named)")
    parser.add_argument("--same-thread", action="store_true",
                        help="run autograd's backward on the calling thread (torch runs a CUDA backward on a thread "
                             "of its own, which cProfile does not see)")
    parser.add_argument("--dtype", choices=DTYPES, default="float32")
    parser.add_argument("--amp", choices=DTYPES[1:])
    parser.add_argument("--categories", action="store_true",
                        help="device time per call by category for every backend, and where each loses")
    parser.add_argument("--kernels", action="store_true",
                        help="instead of cProfile, torch.profiler's device time per kernel, for every backend")
    args = parser.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    if args.same_thread:
        torch.autograd.set_multithreading_enabled(False)
    preset = args.preset or ("large" if args.device.startswith("cuda") else "small")
    backends = args.backends.split(",")
    options = Options(device=args.device, mode=args.mode, preset=preset, precision=Precision(args.dtype, args.amp))
    for name in args.models.split(","):
        built = get_model(name).build(preset)
        options.precision.cast_model(built.module)
        inputs = options.inputs(built, 0, tiny=args.tiny)
        times = {}
        steps = {}
        for b in backends:
            model = fresh_copy(built.module, args.device)
            backend = get_backend(b)
            step = steps[b] = options.step(backend.compile(model), model)
            step(inputs)
            run_until_compiled(functools.partial(step, inputs), backend.wait_compiled)  # kernels, not the interpreter
            times[b] = per_step_ms(steps[b], inputs, args.device)
        cells = "  ".join(f"{b} {t:.3f} ms" for b, t in times.items())
        print(f"== {name} ({args.mode}, {'tiny' if args.tiny else preset}, {args.device}, "
              f"{options.precision.amp and 'autocast ' + options.precision.amp or options.precision.dtype}): {cells}")
        if args.categories:
            print(category_table({b: device_categories(steps[b], inputs, args.device, 10) for b in backends}))
            continue
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
