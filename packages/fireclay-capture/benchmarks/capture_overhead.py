"""Per-call overhead of a cache hit: guard check + input extraction + dispatch.

Model: 50 Linear(16, 16) layers in an nn.Sequential (100 parameter tensors). Prints

* the generated guard function's cost per call (checks every parameter's identity and metadata);
* the whole captured call with a backend that does no work (returns a fixed output), i.e. the
  capture layer's overhead alone;
* for scale, an eager forward and the captured forward through the ``eager`` backend
  (fireclay-ir's reference interpreter).

Run: ``python packages/fireclay-capture/benchmarks/capture_overhead.py``
"""

from __future__ import annotations

import timeit

import torch
import torch.nn as nn

from fireclay_capture import capture


def per_call_us(fn, number: int) -> float:
    fn()
    best = min(timeit.repeat(fn, number=number, repeat=5))
    return best / number * 1e6


def main() -> None:
    torch.manual_seed(0)
    model = nn.Sequential(*[nn.Linear(16, 16) for _ in range(50)]).eval()
    n_params = len(list(model.parameters()))
    x = torch.randn(4, 16)
    fixed = [torch.zeros(4, 16)]

    noop = capture(model, backend=lambda program, inputs: (lambda *args: fixed), fullgraph=True)
    noop(x)
    entry = noop.cache.entries[0]
    guard_us = per_call_us(lambda: entry.guards({"self": model, "input": x}), 20000)
    noop_us = per_call_us(lambda: noop(x), 20000)

    eager_us = per_call_us(lambda: model(x), 2000)
    interpreted = capture(model, fullgraph=True)
    interpreted(x)
    interpreted_us = per_call_us(lambda: interpreted(x), 2000)

    print(f"model: {n_params} parameter tensors, {len(entry.guards.guards)} guards")
    print(f"guard function per call:              {guard_us:8.2f} us")
    print(f"captured call, no-op backend:         {noop_us:8.2f} us  (guards + binding + dispatch)")
    print(f"eager forward:                        {eager_us:8.2f} us")
    print(f"captured call, 'eager' backend:       {interpreted_us:8.2f} us  (reference interpreter)")


if __name__ == "__main__":
    main()
