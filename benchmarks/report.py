"""Results out: the JSON file, the Markdown tables with geometric means, progress lines."""

from __future__ import annotations

import importlib.metadata
import json
import math
import os
import platform
import statistics
import subprocess
from collections.abc import Iterable

import torch

from benchmarks.runner import REPO_ROOT, Cell


def _version(dist: str) -> str | None:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return None


def _cpu_name() -> str:
    try:
        with open("/proc/cpuinfo") as cpuinfo:
            for line in cpuinfo:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def git_commit() -> str | None:
    """The checkout's short commit, with "+changes" when the tracked files differ from it (a copy
    of a working tree whose git folder is older than its files says so, instead of naming a
    commit whose code did not run)."""
    try:
        done = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO_ROOT, capture_output=True,
                              text=True, timeout=10)
        changed = subprocess.run(["git", "diff", "--quiet", "HEAD", "--"], cwd=REPO_ROOT, capture_output=True,
                                 timeout=30).returncode == 1
    except (OSError, subprocess.SubprocessError):
        return None
    commit = done.stdout.strip()
    return (commit + ("+changes" if changed else "")) or None


def environment(device: str) -> dict:
    gpu = torch.cuda.get_device_name() if device.startswith("cuda") and torch.cuda.is_available() else None
    return {
        "cpu": _cpu_name(), "cpu_count": os.cpu_count(), "torch_threads": torch.get_num_threads(), "gpu": gpu,
        "python": platform.python_version(), "platform": platform.platform(),
        "versions": {dist: _version(dist) for dist in ("torch", "transformers", "triton", "fireclay")},
        "git_commit": git_commit(),
        # Other work on the machine shows here first: a load above the CPU count slows every column.
        "load_average_at_start": load_average(),
    }


def load_average() -> list[float] | None:
    try:
        return [round(load, 2) for load in os.getloadavg()]
    except OSError:
        return None


def geomean(values: Iterable[float | None]) -> float | None:
    kept = [v for v in values if v is not None and v > 0 and math.isfinite(v)]
    return math.exp(sum(math.log(v) for v in kept) / len(kept)) if kept else None


def _fmt(value, digits: int = 2, suffix: str = "") -> str:
    if value is None:
        return "—"
    if isinstance(value, float):
        if not math.isfinite(value):
            return "inf"
        return f"{value:.{digits}f}{suffix}"
    return f"{value}{suffix}"


def _signed(value: float | None) -> str:
    return "—" if value is None else f"{value:+.0f}"


def summary_rows(cells: list[Cell], backends: list[str]) -> list[dict]:
    eager_peak = {c.model: c.peak_mb for c in cells if c.backend == "eager"}
    rows = []
    for backend in backends:
        mine = [c for c in cells if c.backend == backend]
        passed = [c for c in mine if c.status == "pass"]
        memory_ratios = [c.peak_mb / eager_peak[c.model] for c in passed
                         if c.peak_mb is not None and eager_peak.get(c.model)]
        overheads = [c.overhead_us for c in passed if c.overhead_us is not None]
        rows.append({
            "backend": backend,
            "models": len(mine),
            **{status: sum(c.status == status for c in mine)
               for status in ("pass", "inaccurate", "error", "unavailable")},
            "speedup_geomean": geomean(c.speedup for c in passed),
            "first_compile_s_geomean": geomean(c.first_compile_s for c in passed),
            "first_compiled_s_geomean": geomean(c.first_compiled_s for c in passed),
            "warm_compile_s_geomean": geomean(c.warm_compile_s for c in passed),
            "cold_compile_s_geomean": geomean(c.cold_compile_s for c in passed),
            "cold_compiled_s_geomean": geomean(c.cold_compiled_s for c in passed),
            "overhead_us_median": statistics.median(overheads) if overheads else None,
            "peak_memory_vs_eager_geomean": geomean(memory_ratios),
        })
    return rows


def markdown(meta: dict, cells: list[Cell], backends: list[str]) -> str:
    env = meta["environment"]
    lines = [
        f"# fireclay benchmarks: {meta['suite']} suite, {meta['mode']}, {meta['device']}, preset {meta['preset']}, "
        f"{'autocast ' + meta['amp'] if meta.get('amp') else meta.get('dtype', 'float32')}",
        "",
        f"- date (UTC): {meta['date']}; commit {env['git_commit']}; command: `{meta['command']}`",
        f"- machine: {env['gpu'] or env['cpu']}, {env['cpu_count']} CPUs, {env['torch_threads']} torch threads; "
        + ", ".join(f"{k} {v}" for k, v in env["versions"].items() if v),
        f"- load average (1, 5, 15 min) at start {env.get('load_average_at_start')}, at end "
        f"{meta.get('load_average_at_end')}",
        f"- timing: median of {meta['repeats']} interleaved samples of "
        f"{'process CPU time' if meta.get('clock') == 'cpu' else 'wall time'}; accuracy: relative error against eager "
        "(max |a-b| / max |b| per tensor) within the model's tolerance, float64 second opinion on a miss",
        "",
        "## Summary",
        "",
        "Geometric means over the models that pass on that backend; overhead is a median "
        "(it can be negative); memory is the geomean ratio of peak memory to eager's. Compile times: "
        "\"compile\" until the first output, \"compiled\" until compiled code is in use (they differ where "
        "kernels compile in the background).",
        "",
        "| backend | pass | inaccurate | error | unavailable | speedup | first compile s | first compiled s "
        "| warm compile s | cold compile s | cold compiled s | overhead µs | peak mem vs eager |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for row in summary_rows(cells, backends):
        lines.append(
            f"| {row['backend']} | {row['pass']}/{row['models']} | {row['inaccurate']} | {row['error']} "
            f"| {row['unavailable']} | {_fmt(row['speedup_geomean'], 2, 'x')} "
            f"| {_fmt(row['first_compile_s_geomean'])} | {_fmt(row['first_compiled_s_geomean'])} "
            f"| {_fmt(row['warm_compile_s_geomean'])} | {_fmt(row['cold_compile_s_geomean'])} "
            f"| {_fmt(row['cold_compiled_s_geomean'])} | {_signed(row['overhead_us_median'])} "
            f"| {_fmt(row['peak_memory_vs_eager_geomean'], 2, 'x')} |")
    lines += [
        "",
        "## Per model",
        "",
        "| model | family | backend | status | time ms | speedup | first compile s | compiled s | warm s | cold s "
        "| cold compiled s | tiny ms | overhead µs | peak MiB | graphs | breaks | max rel err |",
        "| --- | --- | --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: "
        "| ---: |",
    ]
    for c in cells:
        error = "—" if c.max_error is None else ("inf" if not math.isfinite(c.max_error) else f"{c.max_error:.1e}")
        lines.append(
            f"| {c.model} | {c.family} | {c.backend} | {c.status} | {_fmt(c.time_ms, 3)} "
            f"| {_fmt(c.speedup, 2, 'x')} | {_fmt(c.first_compile_s)} | {_fmt(c.first_compiled_s)} "
            f"| {_fmt(c.warm_compile_s)} | {_fmt(c.cold_compile_s)} | {_fmt(c.cold_compiled_s)} "
            f"| {_fmt(c.tiny_ms, 3)} | {_signed(c.overhead_us)} "
            f"| {_fmt(c.peak_mb, 1)} | {_fmt(c.graphs)} | {_fmt(c.breaks)} | {error} |")
    problems = [c for c in cells if c.status != "pass" or any(not n.startswith("Traceback") for n in c.notes)]
    if problems:
        lines += ["", "## Failures, unavailable cells and notes", ""]
        # One line per backend and reason, naming the models: 22 "not available yet" cells read as one.
        grouped: dict[tuple[str, str, str], list[str]] = {}
        for c in problems:
            notes = [n for n in c.notes if not n.startswith("Traceback")]
            text = "; ".join(filter(None, [c.reason, *notes]))
            grouped.setdefault((c.backend, c.status, text), []).append(c.model)
        for (backend, status, text), models in grouped.items():
            lines.append(f"- **{backend}** on {', '.join(models)} ({status}): {text}")
    return "\n".join(lines) + "\n"


def claim_stem(out_dir: str, stem: str) -> str:
    """``stem``, or ``stem-2``, ``stem-3``... where a run that started in the same minute (another
    GPU of the machine) already writes to it: its JSON file is created here, empty, to claim it."""
    os.makedirs(out_dir, exist_ok=True)
    taken, n = stem, 2
    while True:
        try:
            with open(os.path.join(out_dir, taken + ".json"), "x"):
                return taken
        except FileExistsError:
            taken, n = f"{stem}-{n}", n + 1


def write(out_dir: str, stem: str, meta: dict, cells: list[Cell], backends: list[str]) -> tuple[str, str]:
    os.makedirs(out_dir, exist_ok=True)
    json_path, md_path = os.path.join(out_dir, stem + ".json"), os.path.join(out_dir, stem + ".md")
    payload = {"meta": meta, "summary": summary_rows(cells, backends), "cells": [c.as_dict() for c in cells]}
    with open(json_path, "w") as out:
        json.dump(payload, out, indent=1, default=str)
        out.write("\n")
    with open(md_path, "w") as out:
        out.write(markdown(meta, cells, backends))
    return json_path, md_path


def progress_line(index: int, total: int, cell: Cell) -> str:
    head = f"[{index}/{total}] {cell.model:<20} {cell.backend:<12} {cell.status:<11}"
    if cell.status in ("error", "unavailable"):
        return f"{head} {cell.reason}"
    parts = [f"{_fmt(cell.speedup, 2, 'x'):>7}", f"time {_fmt(cell.time_ms, 3)} ms"]
    if cell.first_compile_s is not None and cell.backend != "eager":
        parts.append(f"first {cell.first_compile_s:.2f}s")
        if cell.first_compiled_s is not None and cell.first_compiled_s - cell.first_compile_s > 0.005:
            parts.append(f"compiled {cell.first_compiled_s:.2f}s")
    if cell.warm_compile_s is not None:
        parts.append(f"warm {cell.warm_compile_s:.2f}s")
    if cell.cold_compile_s is not None:
        parts.append(f"cold {cell.cold_compile_s:.2f}s")
    if cell.cold_compiled_s is not None and cell.cold_compile_s is not None \
            and cell.cold_compiled_s - cell.cold_compile_s > 0.005:
        parts.append(f"cold compiled {cell.cold_compiled_s:.2f}s")
    if cell.overhead_us is not None and cell.backend != "eager":
        parts.append(f"overhead {cell.overhead_us:+.0f}us")
    if cell.peak_mb is not None:
        parts.append(f"peak {cell.peak_mb:.1f}MiB")
    if cell.graphs is not None:
        parts.append(f"graphs {cell.graphs} breaks {cell.breaks}")
    if cell.status == "inaccurate":
        parts.append(cell.reason)
    return f"{head} " + "  ".join(parts)
