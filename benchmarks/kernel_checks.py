"""What fireclay-loops' kernel checks cost (``config.kernel_checks``: indices read from tensors
bounds-checked, integer divisors checked for zero): programs made of indirect loads, compiled
with the checks on and off in one process, timed interleaved.

    python -m benchmarks.kernel_checks [--threads 1] [--repeats 15] [--models bert,mlp] [--clock cpu]
    python -m benchmarks.kernel_checks --device cuda [--repeats 15] [--models bert]

Prints milliseconds per call (median) with the checks on and off, and the slowdown, per program;
``--models`` also times models of the benchmark suite (two builds of each, one per variant).
``--clock cpu`` times the process's CPU time instead of the wall clock: on a machine others load,
the time the process waits for a core is not counted (with ``--threads 1``, its CPU time is the
work done). ``--device cuda`` puts the inputs (and models) on the GPU, so the programs compile to
Triton kernels, whose checks are device-side asserts in kernels compiled in Triton's debug mode;
times are wall time between synchronisations, and kernels compile before timing (no background
compile). Integer division is not checked on CUDA (eager gives a value there), so its two variants
are the same code.
"""

from __future__ import annotations

import argparse
import statistics
import time
import types

import torch

import fireclay
import fireclay_loops


def _programs(device: str = "cpu") -> dict:
    """name -> (function, its arguments on ``device``)."""
    return {name: (fn, tuple(a.to(device) for a in args)) for name, (fn, args) in _cpu_programs().items()}


def _cpu_programs() -> dict:
    gen = torch.Generator().manual_seed(0)
    weight = torch.randn(50_000, 256, generator=gen)
    ids = torch.randint(0, 50_000, (64, 512), generator=gen)
    table = torch.randn(4096, 1024, generator=gen)
    cols = torch.randint(0, 1024, (4096, 256), generator=gen)
    rows = torch.randint(0, 4096, (8192,), generator=gen)
    a = torch.randint(-1000, 1000, (4096, 1024), generator=gen)
    d = torch.randint(1, 50, (4096, 1024), generator=gen)
    return {
        # token and position embeddings summed: BERT's input, at a large batch
        "embedding": (lambda w, i: torch.nn.functional.embedding(i, w) * 2.0 + 1.0, (weight, ids)),
        "gather": (lambda t, c: torch.gather(t, 1, c).sum(dim=1), (table, cols)),
        "index_select": (lambda t, r: t.index_select(0, r).relu(), (table, rows)),
        "x[idx]": (lambda t, r: t[r] + 1.0, (table, rows)),
        "int //, %": (lambda x, y: x // y + x % y, (a, d)),
    }


def _copy(fn, tag: str):
    """A function of its own code object (the capture cache is per code object)."""
    return types.FunctionType(fn.__code__.replace(co_name=f"{fn.__code__.co_name}_{tag}"), fn.__globals__,
                              closure=fn.__closure__)


def _compiled(fn, args, checks: bool, kwargs=None):
    """``fn`` compiled (by its first call, here) with the checks on or off; called with ``args``
    and ``kwargs``."""
    fireclay_loops.config.kernel_checks = checks
    try:
        # (CUDA graphs compile in the background by default, running in the interpreter meanwhile:
        # the first call here must leave the compiled kernels in place)
        with fireclay.config.patch(background_compile=False):
            compiled = fireclay.compile(fn)
            with torch.no_grad():
                compiled(*args, **(kwargs or {}))
        return compiled if not kwargs else lambda *a: compiled(*a, **kwargs)
    finally:
        fireclay_loops.config.kernel_checks = True


def _cuda_wall() -> float:
    """The wall clock once the GPU has finished the work queued so far."""
    torch.cuda.synchronize()
    return time.perf_counter()


CLOCKS = {"wall": time.perf_counter, "cpu": time.process_time, "cuda": _cuda_wall}


def _ms(fn, args, runs: int, clock=time.perf_counter) -> float:
    start = clock()
    for _ in range(runs):
        fn(*args)
    return (clock() - start) * 1e3 / runs


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--threads", type=int, default=0, help="torch CPU threads (default: torch's choice)")
    parser.add_argument("--repeats", type=int, default=15, help="interleaved samples per variant")
    parser.add_argument("--runs", type=int, default=5, help="calls per sample")
    parser.add_argument("--models", default="", help="suite models to time too (comma-separated)")
    parser.add_argument("--only-models", action="store_true", help="skip the indexing programs")
    parser.add_argument("--clock", choices=sorted(CLOCKS), default="wall",
                        help="wall: elapsed time; cpu: the process's CPU time (steadier on a loaded machine)")
    parser.add_argument("--only", default="", help="time only these indexing programs (comma-separated)")
    parser.add_argument("--device", choices=["cpu", "cuda"], default="cpu",
                        help="cpu: C++ kernels; cuda: Triton kernels on the GPU")
    options = parser.parse_args()
    if options.threads:
        torch.set_num_threads(options.threads)
    if options.device == "cuda":
        if not torch.cuda.is_available():
            parser.error("--device cuda needs a CUDA GPU")
        if options.clock == "cpu":
            parser.error("--clock cpu times the host only; on --device cuda times are wall time between syncs")
        options.clock = "cuda"
    print(f"device {options.device} ({torch.cuda.get_device_name() if options.device == 'cuda' else 'C++'}), "
          f"clock {options.clock}", flush=True)
    print(f"{'program':<18} {'checks on ms':>13} {'checks off ms':>14} {'slowdown':>9}")
    pairs = [] if options.only_models else [
        (name, _compiled(_copy(fn, "on"), args, True), _compiled(_copy(fn, "off"), args, False), args)
        for name, (fn, args) in _programs(options.device).items()
        if not options.only or name in options.only.split(",")]
    for name in filter(None, options.models.split(",")):
        from benchmarks.models import get_model

        built = [get_model(name).build("small") for _ in range(2)]  # (a module each: guards tell them apart)
        for b in built:
            b.module.to(options.device)
        inputs = built[0].inputs(0, options.device)
        on, off = (_compiled(b.module, inputs.args, checks, inputs.kwargs) for b, checks in zip(built, (True, False)))
        pairs.append((name, on, off, inputs.args))
    for name, on, off, args in pairs:
        with torch.no_grad():
            _time(name, on, off, args, options)


def _time(name, on, off, args, options) -> None:
    """Median ms per call of each variant, samples interleaved (the machine's load hits both)."""
    for f in (on, off):  # warm up: first calls
        f(*args)
    times: dict[str, list[float]] = {"on": [], "off": []}
    for _ in range(options.repeats):
        times["on"].append(_ms(on, args, options.runs, CLOCKS[options.clock]))
        times["off"].append(_ms(off, args, options.runs, CLOCKS[options.clock]))
    t_on, t_off = statistics.median(times["on"]), statistics.median(times["off"])
    print(f"{name:<18} {t_on:>13.3f} {t_off:>14.3f} {100 * (t_on / t_off - 1):>8.1f}%", flush=True)


if __name__ == "__main__":
    main()
