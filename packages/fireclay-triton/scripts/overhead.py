"""Per-call cost of small compiled programs, where launch overhead dominates: eager, the
compiled program called plainly, and the same under CUDA graphs (``cudagraphify``).

Run on a CUDA GPU:  python scripts/overhead.py

Times are medians of many back-to-back calls, synchronised at the end of each batch (so they
include the CPU time to issue every kernel); the programs are tiny, so the times are mostly
overhead.
"""

from __future__ import annotations

import statistics
import time

import torch
from bandwidth import _call, _meta

import fireclay_triton
from fireclay_ir import Graph, Program
from fireclay_triton import compile_program, cudagraphify


def block_program(rows, cols):
    """layer_norm -> gelu -> softmax -> add: a few kernels over small tensors."""
    g = Graph("main")
    x = g.add_input("x", _meta((rows, cols)))
    w = g.add_input("w", _meta((cols,)))
    b = g.add_input("b", _meta((cols,)))
    h = _call(g, "native_layer_norm.default", x, [cols], w, b, 1e-5)[0]
    h = _call(g, "gelu.default", h)
    s = _call(g, "_softmax.default", h, 1, False)
    t = _call(g, "sum.dim_IntList", h, [0])
    g.set_outputs([_call(g, "add.Tensor", s, x), t])
    return Program.single(g), [(rows, cols), (cols,), (cols,)]


def eager_block(x, w, b):
    h = torch.nn.functional.gelu(torch.nn.functional.layer_norm(x, (x.shape[1],), w, b))
    return torch.softmax(h, 1) + x, h.sum(0)


def per_call_us(fn, args, calls=200, repeats=7) -> float:
    for _ in range(20):
        fn(*args)
    torch.cuda.synchronize()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        for _ in range(calls):
            fn(*args)
        torch.cuda.synchronize()
        times.append((time.perf_counter() - start) / calls * 1e6)
    return statistics.median(times)


def main() -> None:
    if not torch.cuda.is_available():
        raise SystemExit("overhead.py needs a CUDA GPU")
    print(f"{torch.cuda.get_device_name()}: microseconds per call (median)")
    header = (f"{'program':24s} {'kernels':>7s} {'eager':>8s} {'fireclay':>9s} {'Triton launch':>14s} "
              f"{'+cudagraphs':>12s}")
    print(header)
    print("-" * len(header))
    for rows, cols in ((8, 256), (64, 1024), (512, 4096)):
        program, shapes = block_program(rows, cols)
        inputs = [torch.randn(s, device="cuda") for s in shapes]
        compiled = compile_program(program, inputs)
        # the same program launched through Triton's own fn[grid](...) on every launch
        with fireclay_triton.config.patch(direct_launch=False):
            plain = compile_program(program, inputs)
            plain(*inputs)
        graphed = cudagraphify(compiled, inputs)
        want = eager_block(*inputs)
        for got in (compiled(*inputs), compiled(*inputs), plain(*inputs), graphed(*inputs), graphed(*inputs)):
            for g, w in zip(got, want):
                torch.testing.assert_close(g, w, atol=1e-4, rtol=1e-4)
        e, c, p, gr = (per_call_us(f, inputs) for f in (eager_block, compiled, plain, graphed))
        print(f"{f'block [{rows}x{cols}]':24s} {len(compiled.kernels):7d} {e:8.1f} {c:9.1f} {p:14.1f} {gr:12.1f}")


if __name__ == "__main__":
    main()
