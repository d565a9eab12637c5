"""Per-call overhead of fireclay-capture on a cache hit: guard check, input extraction, dispatch.

Model: 50 ``Linear(16, 16)`` layers in an ``nn.Sequential`` (100 parameter tensors). Measures

* the generated guard function alone (every parameter's identity and metadata is checked);
* the whole captured call with a backend that does no work (returns a fixed output), that is the
  capture layer's own overhead;
* for scale, an eager forward and the captured forward through the ``eager`` backend (fireclay-ir's
  reference interpreter);
* a function with a graph break (one ``print``-like eager call between two graphs) against the
  same function eagerly: the cost of running two graphs and a resume function.

Run from the repository root: ``python -m benchmarks.capture_overhead`` (``--out DIR`` to write
elsewhere than ``benchmarks/results/``). Prints a table and writes
``capture-overhead-<YYYYmmdd-HHMM>.md`` and ``.json``. Each row is the best of several timed
repeats, so a loaded machine inflates every row about alike; compare rows of one run.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import timeit

import torch
import torch.nn as nn

from benchmarks.report import environment
from benchmarks.runner import REPO_ROOT
from fireclay_capture import capture, disable


def per_call_us(fn, number: int) -> float:
    fn()
    best = min(timeit.repeat(fn, number=number, repeat=5))
    return best / number * 1e6


@disable
def _eager_step(t):
    return t


def _with_a_break(x):
    y = x * 2 + 1
    y = _eager_step(y)
    return y.relu() - 1


def measure() -> tuple[list[dict], dict]:
    torch.manual_seed(0)
    model = nn.Sequential(*[nn.Linear(16, 16) for _ in range(50)]).eval()
    n_params = len(list(model.parameters()))
    x = torch.randn(4, 16)
    fixed = [torch.zeros(4, 16)]

    noop = capture(model, backend=lambda program, inputs: (lambda *args: fixed), fullgraph=True)
    noop(x)
    entry = noop.cache.entries[0]
    guards = {"self": model, "input": x}
    rows = [
        {"what": "guard function per call", "us": per_call_us(lambda: entry.guards(guards), 20000),
         "note": f"{len(entry.guards.guards)} guards"},
        {"what": "captured call, no-op backend", "us": per_call_us(lambda: noop(x), 20000),
         "note": "guards + binding + dispatch"},
        {"what": "eager forward", "us": per_call_us(lambda: model(x), 2000), "note": "50 x Linear(16, 16)"},
    ]
    interpreted = capture(model, fullgraph=True)
    interpreted(x)
    rows.append({"what": "captured call, 'eager' backend", "us": per_call_us(lambda: interpreted(x), 2000),
                 "note": "reference interpreter"})
    small = torch.randn(8)
    broken = capture(_with_a_break)
    broken(small)
    rows.append({"what": "eager function with one break", "us": per_call_us(lambda: _with_a_break(small), 5000),
                 "note": "plain Python"})
    rows.append({"what": "captured, one graph break", "us": per_call_us(lambda: broken(small), 5000),
                 "note": f"{broken.graph_count()} graphs, resume function included"})
    return rows, {"parameters": n_params, "guards": len(entry.guards.guards)}


def markdown(meta: dict, rows: list[dict]) -> str:
    env = meta["environment"]
    lines = [f"# capture overhead ({meta['date']})", "",
             f"CPU {env['cpu']} ({env['cpu_count']} cores, load {env['load_average_at_start']}), "
             f"Python {env['python']}, torch {env['versions']['torch']}, commit {env['git_commit']}", "",
             "| measurement | µs per call | note |", "| --- | ---: | --- |"]
    lines += [f"| {r['what']} | {r['us']:.2f} | {r['note']} |" for r in rows]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=os.path.join(REPO_ROOT, "benchmarks", "results"))
    args = parser.parse_args(argv)
    rows, model = measure()
    now = datetime.datetime.now(datetime.UTC)
    meta = {"date": now.strftime("%Y-%m-%d %H:%M UTC"), "environment": environment("cpu"), "model": model}
    text = markdown(meta, rows)
    print(text)
    os.makedirs(args.out, exist_ok=True)
    stem = os.path.join(args.out, f"capture-overhead-{now.strftime('%Y%m%d-%H%M')}")
    with open(stem + ".md", "w") as f:
        f.write(text)
    with open(stem + ".json", "w") as f:
        json.dump({**meta, "rows": rows}, f, indent=2)
    print(f"wrote {stem}.md and .json")


if __name__ == "__main__":
    main()
