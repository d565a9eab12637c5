"""Cold vs warm compile time across processes: the compile cache's effect.

    python packages/fireclay/benchmarks/compile_cache.py [--rounds 2] [--train]

Builds BERT (Hugging Face ``BertForMaskedLM`` from the benchmarks' "small" sizes: hidden 64,
2 layers, 4 heads, vocabulary 512, batch 2 × 32 tokens; random weights, no download) in fresh
processes that share one new cache folder. The first process compiles cold (empty cache:
every stage runs, fireclay-cpp builds its libraries); each later one is warm (autograd and
loops artifacts and the libraries come from the cache; capture still runs). Each process times
its first compiled call (capture, compile and one run), then a steady call, and prints the
compile cache's counts. Cold and warm processes alternate when ``--rounds`` > 1 (each cold one
with a new folder), so that machine load affects both alike.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

_CHILD = "--child"


def child(train: bool) -> None:
    import torch
    import transformers

    import fireclay

    torch.manual_seed(0)
    config = transformers.BertConfig(vocab_size=512, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                                     intermediate_size=128, max_position_embeddings=64)
    model = transformers.BertForMaskedLM(config).eval()
    ids = torch.randint(0, 512, (2, 32))
    compiled = fireclay.compile(model)

    def step():
        if train:
            out = compiled(input_ids=ids).logits
            out.sum().backward()
            return out
        with torch.no_grad():
            return compiled(input_ids=ids).logits

    start = time.perf_counter()
    got = step()
    first = time.perf_counter() - start
    start = time.perf_counter()
    step()
    steady = time.perf_counter() - start
    with torch.no_grad():
        expected = model(input_ids=ids).logits
    torch.testing.assert_close(got.detach(), expected, atol=1e-4, rtol=1e-4)
    print("RESULT " + json.dumps({"first_call_s": first, "steady_call_s": steady,
                                  "compile_s": first - steady, "cache": fireclay.cache_stats()}))


def run_process(cache: str, train: bool) -> dict:
    env = dict(os.environ, FIRECLAY_CACHE_DIR=cache)
    env.pop("FIRECLAY_COMPILE_CACHE", None)
    args = [sys.executable, __file__, _CHILD] + (["--train"] if train else [])
    done = subprocess.run(args, capture_output=True, text=True, env=env, timeout=1800)
    if done.returncode != 0:
        raise RuntimeError(done.stderr[-3000:])
    return json.loads(next(x for x in done.stdout.splitlines() if x.startswith("RESULT ")).removeprefix("RESULT "))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--train", action="store_true", help="a training step (forward + backward)")
    args = parser.parse_args()
    rows = []
    for r in range(args.rounds):
        with tempfile.TemporaryDirectory(prefix="fireclay-cache-bench-") as cache:
            rows.append(("cold", r, run_process(cache, args.train)))
            rows.append(("warm", r, run_process(cache, args.train)))
    what = "training step" if args.train else "inference"
    print(f"BERT small ({what}), CPU, {os.cpu_count()} cores; compile = first call - steady call")
    print("autograd / loops columns: hits/misses, then the seconds spent in that stage (loading hits, "
          "building misses)")
    print(f"{'process':<8} {'round':>5} {'first call':>11} {'compile':>9} {'autograd':>17} {'loops':>17}")
    for kind, r, res in rows:
        a, lp = res["cache"]["autograd"], res["cache"]["loops"]
        cells = [f"{c['hits']}/{c['misses']} {c['load_seconds'] + c['build_seconds']:6.2f}s" for c in (a, lp)]
        print(f"{kind:<8} {r:>5} {res['first_call_s']:>10.2f}s {res['compile_s']:>8.2f}s {cells[0]:>17} {cells[1]:>17}")
    for kind in ("cold", "warm"):
        times = sorted(res["compile_s"] for k, _, res in rows if k == kind)
        print(f"median {kind} compile: {times[len(times) // 2]:.2f} s")


if __name__ == "__main__":
    if _CHILD in sys.argv:
        child("--train" in sys.argv)
    else:
        main()
