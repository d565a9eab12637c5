"""Benchmark one model against every backend: the cells of one row of the results."""

from __future__ import annotations

import dataclasses
import functools
import gc
import json
import os
import subprocess
import sys
import tempfile
import traceback
from dataclasses import dataclass, field

import torch

from benchmarks.backends import ALL_CACHE_ENV, Backend
from benchmarks.measure import (
    Precision,
    Step,
    compare,
    float64_reference,
    fresh_copy,
    judge,
    median_times,
    peak_memory,
    run_until_compiled,
    timed,
)
from benchmarks.models import Inputs, ModelSpec, ModelUnavailable

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
METRICS = ("accuracy", "speed", "memory", "overhead", "warm", "cold", "counts")

# Seeds of the three input sets: compile and time on one, check accuracy on fresh values.
TIMING_SEED, CHECK_SEED, TINY_SEED = 1, 2, 3


@dataclass
class Options:
    device: str = "cpu"
    mode: str = "inference"
    preset: str = "small"
    repeats: int = 10
    metrics: tuple[str, ...] = METRICS
    cold_timeout_s: float = 600.0
    threads: int | None = None
    precision: Precision = field(default_factory=Precision)
    clock: str = "wall"  # measure.CLOCKS: what timing samples read

    def step(self, fn, model: torch.nn.Module) -> Step:
        """One step of `fn` in this run's mode and precision."""
        return Step(fn, model, self.mode, autocast=lambda: self.precision.autocast(self.device))

    def inputs(self, built, seed: int, tiny: bool = False) -> Inputs:
        return self.precision.cast_inputs(built.inputs(seed, self.device, tiny=tiny), self.device)


@dataclass
class Cell:
    """One model on one backend. Times in the unit their name says; None where not measured."""

    model: str
    family: str
    backend: str
    status: str = "pass"  # pass | inaccurate | error | unavailable
    reason: str = ""
    max_error: float | None = None  # worst relative error against eager (see measure.relative_error)
    worst_tensor: str = ""
    time_ms: float | None = None  # median per call (inference) or per training step
    speedup: float | None = None  # eager time_ms / this time_ms
    first_compile_s: float | None = None  # first call in this process, compile included (time to first output)
    # from the first call until compiled code is in use: with background compiles (fireclay on
    # CUDA), the first call and the calls after it until every graph switched to its kernels
    first_compiled_s: float | None = None
    warm_compile_s: float | None = None
    cold_compile_s: float | None = None
    cold_compiled_s: float | None = None  # the cold process's first_compiled_s
    tiny_ms: float | None = None
    overhead_us: float | None = None  # tiny_ms above eager's tiny_ms
    peak_mb: float | None = None
    graphs: int | None = None
    breaks: int | None = None
    notes: list[str] = field(default_factory=list)

    def fail(self, stage: str, error: BaseException) -> None:
        self.status = "error"
        self.reason = f"{stage}: {_one_line(error)}"
        self.notes.append("".join(traceback.format_exception(error, limit=-6)))

    def as_dict(self) -> dict:
        return dataclasses.asdict(self)


def _one_line(error: BaseException) -> str:
    text = str(error).strip().splitlines()
    return f"{type(error).__name__}: {text[0] if text else ''}"[:300]


def bench_model(spec: ModelSpec, backends: list[Backend], options: Options) -> list[Cell]:
    cells = {b.name: Cell(spec.name, spec.family, b.name) for b in backends}
    try:
        built = spec.build(options.preset)
    except ModelUnavailable as error:
        for cell in cells.values():
            cell.status, cell.reason = "unavailable", str(error)
        return list(cells.values())
    except Exception as error:
        for cell in cells.values():
            cell.fail("building the model", error)
        return list(cells.values())

    device, mode = options.device, options.mode
    options.precision.cast_model(built.module)
    tolerance = options.precision.tolerance(spec.tolerance)
    inputs = options.inputs(built, TIMING_SEED)
    check_inputs = options.inputs(built, CHECK_SEED)
    try:
        reference_model = fresh_copy(built.module, device)
        reference = options.step(reference_model, reference_model).observed(check_inputs)
    except Exception as error:
        for cell in cells.values():
            cell.fail("eager reference run", error)
        return list(cells.values())
    reference64 = functools.cache(lambda: float64_reference(built.module, check_inputs, mode, device))

    steps: dict[str, Step] = {}
    for backend in backends:
        cell = cells[backend.name]
        reason = backend.unavailable()
        if reason:
            cell.status, cell.reason = "unavailable", reason
            continue
        try:
            backend.reset()
            backend.wait_compiled()  # (counts only the compiles this model starts)
            backend.start_counting()
            model = fresh_copy(built.module, device)
            step = options.step(backend.compile(model), model)
            initial = {name: t.detach().clone() for name, t in model.state_dict().items()}
            cell.first_compile_s, observed = timed(lambda step=step: step.observed(check_inputs), device)
            settle_s, switches = timed(lambda step=step, wait=backend.wait_compiled:
                                       run_until_compiled(lambda: step(inputs), wait), device)
            cell.first_compiled_s = cell.first_compile_s + settle_s
            observations = [("", observed)]
            if switches:  # the first call ran other code than the calls from now on: check that code too
                model.load_state_dict(initial)
                observations.append((" (compiled kernels)", step.observed(check_inputs)))
            del initial  # (a copy of every parameter: not kept for the measurements below)
        except Exception as error:
            cell.fail("compile and first call", error)
            continue
        steps[backend.name] = step
        if "counts" in options.metrics and not backend.is_eager:
            try:
                counts = backend.counts(model, check_inputs)
                cell.graphs, cell.breaks = counts.graphs, counts.breaks
            except Exception as error:
                cell.notes.append(f"graph counts failed: {_one_line(error)}")
        for which, result in observations:  # the worst of the first call and the compiled code's
            try:
                accuracy = judge(result, reference, tolerance, reference64)
            except Exception as error:  # the float64 run itself failed: keep the float32 verdict
                cell.notes.append(f"float64 reference failed: {_one_line(error)}")
                accuracy = compare(result, reference, tolerance)
            if cell.max_error is None or accuracy.max_error > cell.max_error or not accuracy.passed:
                cell.max_error, cell.worst_tensor = accuracy.max_error, accuracy.worst + which
            if not accuracy.passed:
                cell.status = "inaccurate"
                cell.reason = (f"relative error {accuracy.max_error:.2e} at {accuracy.worst}{which} > tolerance "
                               f"{tolerance:g}" + (f"; {accuracy.detail}" if accuracy.detail else ""))
            elif accuracy.detail:
                cell.notes.append(accuracy.detail)

    waits = {b.name: b.wait_compiled for b in backends}
    _measure_speed(spec, cells, steps, inputs, options, waits)
    if "memory" in options.metrics:
        _measure_memory(cells, steps, inputs, options)
    if "overhead" in options.metrics:
        _measure_overhead(cells, steps, options.inputs(built, TINY_SEED, tiny=True), options, waits)
    if "warm" in options.metrics:
        _measure_warm(built, backends, cells, steps, inputs, options)
    if "cold" in options.metrics:
        for backend in backends:
            if backend.name in steps and not backend.is_eager:
                _measure_cold(spec, backend, cells[backend.name], options)
    steps.clear()
    gc.collect()
    return list(cells.values())


def _guarded_times(cells, thunks, options, what: str, fatal: bool, waits) -> dict[str, float]:
    """median_times over the thunks that run; a thunk that raises is dropped with its reason: the
    cell fails when the measurement is its main one (`fatal`), else it keeps a note. Background
    compiles finish (and every graph switches to compiled code) before the samples."""
    for name, thunk in list(thunks.items()):
        try:
            thunk()  # a first call outside the samples: recompiles for new shapes land here
            run_until_compiled(thunk, waits.get(name, lambda: 0))
        except Exception as error:
            if fatal:
                cells[name].fail(what, error)
            else:
                cells[name].notes.append(f"{what} failed: {_one_line(error)}")
            del thunks[name]
    return median_times(thunks, options.device, options.repeats, clock=options.clock) if thunks else {}


def _measure_speed(spec, cells, steps, inputs, options, waits) -> None:
    if "speed" not in options.metrics:
        return
    thunks = {name: (lambda step=step: step(inputs)) for name, step in steps.items()}
    times = _guarded_times(cells, thunks, options, "timed runs", fatal=True, waits=waits)
    eager = times.get("eager")
    for name, seconds in times.items():
        cells[name].time_ms = seconds * 1e3
        if eager:
            cells[name].speedup = eager / seconds


def _measure_memory(cells, steps, inputs, options) -> None:
    for name, step in steps.items():
        if cells[name].status == "error":
            continue
        gc.collect()
        try:
            with peak_memory(options.device) as memory:
                step(inputs)
        except Exception as error:
            cells[name].notes.append(f"memory run failed: {_one_line(error)}")
            continue
        cells[name].peak_mb = memory["peak_mb"]


def _measure_overhead(cells, steps, tiny_inputs, options, waits) -> None:
    live = {name: step for name, step in steps.items() if cells[name].status != "error"}
    thunks = {name: (lambda step=step: step(tiny_inputs)) for name, step in live.items()}
    times = _guarded_times(cells, thunks, options, "tiny-input runs", fatal=False, waits=waits)
    eager = times.get("eager")
    for name, seconds in times.items():
        cells[name].tiny_ms = seconds * 1e3
        if eager is not None:
            cells[name].overhead_us = (seconds - eager) * 1e6


def _measure_warm(built, backends, cells, steps, inputs, options) -> None:
    """Second compile in this process: in-memory state reset, on-disk caches as the first left them."""
    for backend in backends:
        if backend.is_eager or backend.name not in steps or cells[backend.name].status == "error":
            continue
        try:
            backend.reset()
            model = fresh_copy(built.module, options.device)
            step = options.step(backend.compile(model), model)
            cells[backend.name].warm_compile_s, _ = timed(lambda step=step: step(inputs), options.device)
            run_until_compiled(lambda step=step: step(inputs), backend.wait_compiled)  # none left running
        except Exception as error:
            cells[backend.name].notes.append(f"warm compile failed: {_one_line(error)}")


def cold_command(spec: ModelSpec, backend: Backend, options: Options) -> list[str]:
    return [sys.executable, "-m", "benchmarks.cold", "--model", spec.name, "--backend", backend.name,
            "--preset", options.preset, "--device", options.device, "--mode", options.mode,
            *precision_args(options.precision), *(["--threads", str(options.threads)] if options.threads else [])]


def precision_args(precision: Precision) -> list[str]:
    """The command-line words that select `precision` (for the child processes of a run)."""
    return ["--dtype", precision.dtype, *(["--amp", precision.amp] if precision.amp else [])]


def prime(backend: Backend, options: Options) -> None:
    """Compile and run a two-layer toy once, then reset: the compiler's one-time costs (lazy
    imports, worker pools) then land here, not on the first model's "first compile" column.
    The cold-compile column, measured in fresh processes, keeps them."""
    if backend.unavailable():
        return
    toy = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.ReLU()).to(options.device)
    try:
        options.precision.cast_model(toy)
        step = options.step(backend.compile(toy), toy)
        toy_inputs = options.precision.cast_inputs(Inputs((torch.randn(4, 8, device=options.device),)),
                                                   options.device)
        step(toy_inputs)
        run_until_compiled(lambda: step(toy_inputs), backend.wait_compiled)
    except Exception:
        pass  # the model runs report the backend's failures, with their reasons
    finally:
        backend.reset()


def _measure_cold(spec, backend, cell, options) -> None:
    """First call in a fresh process with fresh, empty cache directories (see benchmarks/cold.py)."""
    with tempfile.TemporaryDirectory(prefix="fireclay-bench-cold-") as cache_root:
        env = dict(os.environ)
        for variable in ALL_CACHE_ENV:
            env[variable] = os.path.join(cache_root, variable.lower())
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [REPO_ROOT, env.get("PYTHONPATH")]))
        try:
            done = subprocess.run(cold_command(spec, backend, options), env=env, cwd=REPO_ROOT,
                                  capture_output=True, text=True, timeout=options.cold_timeout_s)
        except subprocess.TimeoutExpired:
            cell.notes.append(f"cold compile: no result within {options.cold_timeout_s:.0f} s")
            return
    lines = done.stdout.strip().splitlines()
    try:
        report = json.loads(lines[-1])
    except (IndexError, json.JSONDecodeError):
        tail = done.stderr.strip().splitlines()[-1:] or ["no output"]
        cell.notes.append(f"cold compile process failed (exit {done.returncode}): {tail[0][:300]}")
        return
    if report.get("error"):
        cell.notes.append(f"cold compile: {report['error']}")
    cell.cold_compile_s = report.get("cold_compile_s")
    cell.cold_compiled_s = report.get("cold_compiled_s")
