"""Compile time of a typical program, cold (empty cache) and warm (cache hit), per-call overhead,
and run time against eager.

    python packages/fireclay-cpp/bench/compile_time.py [--repeat 3]

The program is a transformer-block-like aten program (layer norm, matmuls, GELU, softmax
attention, residuals) built with fireclay-loops' test builder from the checkout.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.append(os.path.join(HERE, "..", "..", "fireclay-loops", "tests"))

from aten_builder import AtenBuilder  # noqa: E402

import fireclay_cpp  # noqa: E402
import fireclay_ir  # noqa: E402
from fireclay_cpp import Config  # noqa: E402


def block(batch: int = 8, seq: int = 128, dim: int = 256):
    gen = torch.Generator().manual_seed(0)
    shapes = {"x": (batch * seq, dim), "ln_w": (dim,), "ln_b": (dim,), "w_qkv": (dim, 3 * dim),
              "w_up": (dim, 4 * dim), "w_down": (4 * dim, dim)}
    xs = [torch.randn(s, generator=gen) * 0.1 for s in shapes.values()]
    b = AtenBuilder()
    x, ln_w, ln_b, w_qkv, w_up, w_down = (b.input(t, n) for t, n in zip(xs, shapes))
    h = b.call("native_layer_norm.default", x, [dim], ln_w, ln_b, 1e-5)[0]
    qkv = b.call("mm.default", h, w_qkv)
    q = b.call("slice.Tensor", qkv, 1, 0, dim)
    k = b.call("slice.Tensor", qkv, 1, dim, 2 * dim)
    scores = b.call("mm.default", b.call("view.default", b.call("clone.default", q), [batch * seq, dim]),
                    b.call("t.default", k))
    attn = b.call("_softmax.default", b.call("mul.Tensor", scores, dim ** -0.5), 1, False)
    y = b.call("add.Tensor", x, b.call("mm.default", attn, b.call("slice.Tensor", qkv, 1, 2 * dim, 3 * dim)))
    h2 = b.call("native_layer_norm.default", y, [dim], ln_w, ln_b, 1e-5)[0]
    up = b.call("gelu.default", b.call("mm.default", h2, w_up))
    out = b.call("add.Tensor", y, b.call("mm.default", up, w_down))
    return b.output(out), b, xs


def _time(fn, repeat: int) -> float:
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--inductor", action="store_true", help="also time torch.compile (Inductor CPU), cold")
    args = ap.parse_args()
    program, b, xs = block()
    cold, warm = [], []
    for _ in range(args.repeat):
        with tempfile.TemporaryDirectory() as cache, fireclay_ir.config.patch(cache_dir=cache):
            cfg = Config()
            start = time.perf_counter()
            compiled = fireclay_cpp.compile_program(program, cfg=cfg)
            cold.append(time.perf_counter() - start)
            start = time.perf_counter()
            compiled = fireclay_cpp.compile_program(program, cfg=cfg)
            warm.append(time.perf_counter() - start)
            assert compiled.cache_hit
            got = compiled(*xs)
    want = b.eager(*xs)
    torch.testing.assert_close(got[0], want[0], atol=1e-4, rtol=1e-4)
    run_compiled = _time(lambda: compiled(*xs), 20)
    run_eager = _time(lambda: b.eager(*xs), 20)
    tiny, tb, txs = block(1, 1, 8)
    tiny_compiled = fireclay_cpp.compile_program(tiny)
    overhead = _time(lambda: tiny_compiled(*txs), 200)
    kernels = len(compiled.scheduled.kernels)
    print(f"program: transformer block, {kernels} kernels, {len(compiled.scheduled.extern_calls)} extern calls, "
          f"{len(compiled.cpp_sources[0].splitlines())} lines of C++; {os.cpu_count()} CPUs, "
          f"torch threads {torch.get_num_threads()}")
    print(f"cold compile (empty cache): median {statistics.median(cold):.2f} s  {[round(c, 2) for c in cold]}")
    print(f"warm compile (cache hit):   median {statistics.median(warm) * 1000:.1f} ms")
    print(f"run: fireclay-cpp {run_compiled * 1000:.2f} ms, eager (aten op by op) {run_eager * 1000:.2f} ms, "
          f"speedup {run_eager / run_compiled:.2f}x")
    print(f"per-call time of a tiny program (overhead bound): {overhead * 1e6:.1f} us")
    if args.inductor:
        _inductor(b, xs)


def _inductor(b, xs) -> None:
    """The same aten ops through torch.compile, with Inductor's caches in a fresh folder."""
    with tempfile.TemporaryDirectory() as cache:
        os.environ["TORCHINDUCTOR_CACHE_DIR"] = cache
        import torch._inductor.config as inductor_config

        inductor_config.fx_graph_cache = False
        fn = torch.compile(lambda *ts: b.eager(*ts), backend="inductor")
        start = time.perf_counter()
        fn(*xs)
        cold = time.perf_counter() - start
        run = _time(lambda: fn(*xs), 20)
    print(f"inductor: cold compile {cold:.2f} s, run {run * 1000:.2f} ms")


if __name__ == "__main__":
    main()
