"""Per-call cost of a compiled model at batch 1 x 8 tokens, where the framework's own work, not
the kernels, is what a call costs: eager, ``torch.compile`` (Inductor) and ``fireclay.compile``
side by side, and fireclay's call taken apart.

    python -m benchmarks.call_overhead                         # bert, gpt2, llama, t5; small preset
    python -m benchmarks.call_overhead --models bert --calls 500 --clock wall
    python -m benchmarks.call_overhead --backends eager,fireclay --no-split

Each model is built at the ``small`` preset (2 layers, 64 wide) and called with its tiny inputs
(batch 1, 8 tokens) in inference (eval mode, ``torch.no_grad()``), one torch thread. The backends
take turns sample by sample (each sample: ``--calls`` calls), so a busy phase of the machine falls
on all alike; a cell is the median over ``--repeats`` samples. ``--clock cpu`` (the default) reads
the thread's CPU time, which leaves out the time other processes held the core on a shared box.

fireclay's call is split while it runs: each layer is replaced by a stand-in that adds its time
to a counter (a layer timed alone in a loop runs with warm caches and looks cheaper than it is):

* ``bind``: the call's arguments bound to the forward's parameters (the dict the guards read);
* ``guards``: the guard function of the entry that runs, which also gathers the graph's inputs;
* ``graph``: the backend's callable for the captured graph (everything below), of which
  ``autograd`` is fireclay-autograd's runtime around the aten graph (input checks, the
  autograd or inference wrapper, the output plan) and ``code`` the aten graph's compiled program
  (generated wrapper and kernels, and the umbrella's fallback wrapper around it);
* ``rebuild``: the user's return value (a ModelOutput) built around the graph's results;
* ``other``: the rest of the call (``nn.Module`` dispatch, the cache lookup, the umbrella's
  wrappers between the capture and autograd, the stand-ins' own timer reads).

Run from the repository root; prints a markdown
table and, with ``--out DIR``, writes it there as ``call-overhead-<YYYYmmdd-HHMM>.md`` and
``.json``.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import statistics
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

import torch

from benchmarks.models import get_model
from benchmarks.report import environment

MODELS = ("bert", "gpt2", "llama", "t5")
BACKENDS = ("eager", "inductor", "fireclay")
PARTS = ("bind", "guards", "graph", "autograd", "code", "rebuild", "other")


@dataclass
class ModelRow:
    """One model's cells: µs per call per backend, fireclay's parts, the guard count."""

    model: str
    us: dict[str, float | None] = field(default_factory=dict)
    parts: dict[str, float] = field(default_factory=dict)
    guards: int | None = None
    graphs: int | None = None
    note: str = ""


def _clock(name: str) -> Callable[[], float]:
    return time.thread_time if name == "cpu" else time.perf_counter


def interleaved(callables: dict[str, Callable[[], Any]], calls: int, repeats: int, clock: Callable[[], float]
                ) -> dict[str, float]:
    """Median µs per call of each callable, samples taken in turns."""
    for fn in callables.values():  # warm: caches, lazy imports, branch predictors
        for _ in range(max(calls // 10, 3)):
            fn()
    samples: dict[str, list[float]] = {name: [] for name in callables}
    for _ in range(repeats):
        for name, fn in callables.items():
            start = clock()
            for _ in range(calls):
                fn()
            samples[name].append((clock() - start) / calls * 1e6)
    return {name: statistics.median(values) for name, values in samples.items()}


def _compile(backend: str, module: torch.nn.Module) -> Any:
    if backend == "eager":
        return module
    if backend == "inductor":
        return torch.compile(module)
    if backend == "fireclay":
        import fireclay

        return fireclay.compile(module)
    raise ValueError(f"unknown backend {backend!r}: use {', '.join(BACKENDS)}")


class _Timed:
    """A stand-in for one layer of the call that adds the time spent in it to ``spent[part]``."""

    def __init__(self, fn: Callable[..., Any], part: str, spent: dict[str, float], clock: Callable[[], float]):
        self.fn, self.part, self.spent, self.clock = fn, part, spent, clock

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        start = self.clock()
        try:
            return self.fn(*args, **kwargs)
        finally:
            self.spent[self.part] += self.clock() - start

    def __getattr__(self, name: str) -> Any:
        return getattr(self.__dict__["fn"], name)


def _guarded_graph(compiled_graph: Any) -> Any:
    """The umbrella's ``GuardedGraph`` of one captured graph (under ``verifying``'s closure)."""
    for cell in getattr(compiled_graph, "__closure__", None) or ():
        if type(cell.cell_contents).__name__ == "GuardedGraph":
            return cell.cell_contents
    return None


def fireclay_parts(compiled: Any, args: tuple, kwargs: dict, calls: int, repeats: int,
                   clock: Callable[[], float]) -> tuple[dict[str, float], int, str]:
    """fireclay's call taken apart while it runs (see the module docstring): each layer is
    replaced by a stand-in that times it, so every part is measured in the real sequence (a
    layer timed alone in a loop runs with warm caches and looks cheaper). (parts, guard count, note)."""
    import fireclay_capture.cache as capture_cache

    captured = compiled._compiled
    L = captured._bind(args, kwargs)
    entry = next((e for e in captured.cache.entries if e.compiled is not None and e.guards(L) is not None), None)
    if entry is None or entry.graph_break is not None or captured.children:
        return {}, 0, "not split: the call runs several graphs"
    spent = dict.fromkeys(("bind", "guards", "graph", "autograd", "code", "rebuild"), 0.0)
    undo: list[Callable[[], None]] = []

    def replace(obj: Any, name: str, part: str) -> None:
        original = getattr(obj, name)
        setattr(obj, name, _Timed(original, part, spent, clock))
        undo.append(lambda: setattr(obj, name, original))

    note = ""
    graph = _guarded_graph(entry.compiled)
    program = graph.compiled if graph is not None else None
    runtime = getattr(program, "_inference", None)
    try:
        replace(captured, "_bind", "bind")
        replace(entry.guards, "fn", "guards")
        replace(entry, "compiled", "graph")
        replace(capture_cache, "rebuild", "rebuild")
        if runtime is not None and getattr(program, "dynamic", None) is None:
            replace(graph, "compiled", "autograd")
            replace(runtime, "forward", "code")
        else:
            note = "graph not split (no inference runtime found)"
        samples: dict[str, list[float]] = {part: [] for part in (*spent, "whole")}
        for _ in range(max(calls // 10, 3)):
            compiled(*args, **kwargs)
        for _ in range(repeats):
            for part in spent:
                spent[part] = 0.0
            start = clock()
            for _ in range(calls):
                compiled(*args, **kwargs)
            samples["whole"].append((clock() - start) / calls * 1e6)
            for part, seconds in spent.items():
                samples[part].append(seconds / calls * 1e6)
    finally:
        for restore in reversed(undo):
            restore()
    t = {part: statistics.median(values) for part, values in samples.items()}
    parts = {"bind": t["bind"], "guards": t["guards"], "graph": t["graph"], "rebuild": t["rebuild"]}
    if not note:
        parts["autograd"] = t["autograd"] - t["code"]
        parts["code"] = t["code"]
    parts["other"] = t["whole"] - sum(parts[p] for p in ("bind", "guards", "graph", "rebuild"))
    return parts, len(entry.guards.guards), note


def measure_model(name: str, backends: list[str], calls: int, repeats: int, clock_name: str, split: bool) -> ModelRow:
    clock = _clock(clock_name)
    built = get_model(name).build("small")
    module = built.module.eval()
    inputs = built.inputs(3, tiny=True)
    args, kwargs = inputs.args, inputs.kwargs
    row = ModelRow(model=name)
    with torch.no_grad():
        expected = module(*args, **kwargs)
        runs: dict[str, Callable[[], Any]] = {}
        compiled_by: dict[str, Any] = {}
        for backend in backends:
            try:
                compiled = _compile(backend, module)
                got = compiled(*args, **kwargs)
                _check_close(got, expected, f"{name} under {backend}")
            except Exception as exc:  # a backend that fails is a cell that says so; the others go on
                row.us[backend] = None
                row.note += f"{backend}: {type(exc).__name__}: {str(exc).splitlines()[0][:120]}. "
                continue
            compiled_by[backend] = compiled
            runs[backend] = (lambda c: lambda: c(*args, **kwargs))(compiled)
        row.us.update(interleaved(runs, calls, repeats, clock))
        if split and "fireclay" in compiled_by:
            captured = compiled_by["fireclay"]._compiled
            row.graphs = sum(1 for e in captured.cache.entries if e.compiled is not None) + len(captured.children)
            row.parts, row.guards, note = fireclay_parts(compiled_by["fireclay"], args, kwargs, calls, repeats, clock)
            row.note += note
    return row


def _check_close(got: Any, want: Any, what: str) -> None:
    """The timed call's result matches eager's (the first tensor of a ModelOutput or tuple)."""
    def first(x: Any) -> torch.Tensor:
        if isinstance(x, torch.Tensor):
            return x
        values = x.values() if hasattr(x, "values") else x
        return next(v for v in values if isinstance(v, torch.Tensor))

    torch.testing.assert_close(first(got), first(want), rtol=1e-3, atol=1e-4, msg=lambda m: f"{what}: {m}")


def markdown(meta: dict, rows: list[ModelRow], backends: list[str]) -> str:
    env = meta["environment"]
    head = (f"# call overhead ({meta['date']})\n\n"
            f"CPU {env['cpu']} ({env['cpu_count']} cores, load {env['load_average_at_start']}), 1 torch thread, "
            f"clock {meta['clock']}, {meta['calls']} calls x {meta['repeats']} samples (median), Python "
            f"{env['python']}, torch {env['versions']['torch']}, commit {env['git_commit']}\n\n"
            "Inference, batch 1 x 8 tokens, small preset. µs per call.\n\n")
    cols = [*backends, "fireclay / inductor", *PARTS, "guards n"]
    lines = ["| model | " + " | ".join(cols) + " |", "| --- |" + " ---: |" * len(cols)]

    def fmt(x: float | None) -> str:
        return "-" if x is None else f"{x:.0f}"

    for r in rows:
        fc, ind = r.us.get("fireclay"), r.us.get("inductor")
        ratio = f"{fc / ind:.2f}" if fc and ind else "-"
        cells = [fmt(r.us.get(b)) for b in backends] + [ratio] + [fmt(r.parts.get(p)) for p in PARTS]
        cells.append(str(r.guards) if r.guards is not None else "-")
        lines.append(f"| {r.model} | " + " | ".join(cells) + " |")
    notes = [f"- {r.model}: {r.note.strip()}" for r in rows if r.note.strip()]
    return head + "\n".join(lines) + "\n" + ("\n" + "\n".join(notes) + "\n" if notes else "")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default=",".join(MODELS))
    parser.add_argument("--backends", default=",".join(BACKENDS))
    parser.add_argument("--calls", type=int, default=200, help="calls per timing sample")
    parser.add_argument("--repeats", type=int, default=9, help="interleaved samples per backend")
    parser.add_argument("--clock", choices=("cpu", "wall"), default="cpu")
    parser.add_argument("--no-split", action="store_true", help="leave fireclay's call whole")
    parser.add_argument("--out", default=None, help="write the table and JSON into this folder")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    backends = [b for b in args.backends.split(",") if b]
    now = datetime.datetime.now(datetime.UTC)
    meta = {"date": now.strftime("%Y-%m-%d %H:%M UTC"), "environment": environment("cpu"), "clock": args.clock,
            "calls": args.calls, "repeats": args.repeats}
    rows = []
    for name in [m for m in args.models.split(",") if m]:
        rows.append(measure_model(name, backends, args.calls, args.repeats, args.clock, not args.no_split))
        print(f"{name}: " + ", ".join(f"{b} {v:.0f} us" if v else f"{b} failed" for b, v in rows[-1].us.items()),
              flush=True)
    text = markdown(meta, rows, backends)
    print(text)
    if args.out:
        os.makedirs(args.out, exist_ok=True)
        stem = os.path.join(args.out, f"call-overhead-{now.strftime('%Y%m%d-%H%M')}")
        with open(stem + ".md", "w") as f:
            f.write(text)
        with open(stem + ".json", "w") as f:
            json.dump({**meta, "rows": [asdict(r) for r in rows]}, f, indent=2)
        print(f"wrote {stem}.md and .json")


if __name__ == "__main__":
    main()
