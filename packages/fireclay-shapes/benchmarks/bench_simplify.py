"""How fast is range-aware simplification on codegen-style index expressions?

Builds the index expressions a loop-nest code generator asks about (flattened indices of
contiguous, transposed, broadcast and channels-last views over symbolic sizes, split into
FloorDiv/Mod pieces) and reports simplifications per second, cold (every expression new to
the cache) and warm (cache hits), plus printing rates for the three printers.

    python packages/fireclay-shapes/benchmarks/bench_simplify.py
"""

from __future__ import annotations

import time

import sympy

from fireclay_shapes import (
    FloorDiv,
    Max,
    Mod,
    ShapeEnv,
    cpp_code,
    python_code,
    simplify_with_ranges,
    symbol,
    triton_code,
)


def index_expressions(env: ShapeEnv, count: int) -> list[sympy.Expr]:
    s0 = env.create_symbol(64, "a")
    s1 = env.create_symbol(128, "b")
    s2 = env.create_symbol(3, "c")
    exprs = []
    for k in range(count):
        x = symbol(f"x{k % 7}")  # a loop variable, range [0, s0*s1*s2)
        block = 2 ** (k % 6 + 1)
        xblk = symbol(f"xb{k % 5}")
        r0 = symbol(f"r{k % 3}")
        exprs += [
            Mod(FloorDiv(x, s1), s0) * s1 * s2 + Mod(x, s1) + k,                   # permuted view
            FloorDiv(block * xblk + Mod(r0, block), block),                          # tiled loop
            Mod(block * xblk + Mod(r0, block), block),
            FloorDiv(Mod(x, s1 * s2), s2) + s1 * FloorDiv(x, s1 * s2) + k,
            Max(0, FloorDiv(x, 2) - 1) + Max(s0, s0 + k + 1),                        # pooling windows
            Mod(x + k * s1, s1),
        ]
    return exprs


def ranges_for(env: ShapeEnv):
    from fireclay_shapes import ValueRange

    def ranges(s):
        if s.name.startswith(("x", "r")):
            return ValueRange(0, 64 * 128 * 3 - 1) if s.name.startswith("x") else ValueRange(0, 1023)
        return env.range_of_symbol(s) if s.name.startswith("s") else ValueRange(0, 1 << 20)

    return ranges


def main() -> None:
    env = ShapeEnv()
    exprs = index_expressions(env, 400)
    ranges = ranges_for(env)
    t0 = time.perf_counter()
    out = [simplify_with_ranges(e, ranges) for e in exprs]
    cold = time.perf_counter() - t0
    changed = sum(1 for a, b in zip(exprs, out) if a != b)

    # The env's cached path (what codegen calls repeatedly): first pass fills, later ones hit.
    # (The env does not know the loop variables' ranges, so it simplifies less.)
    t0 = time.perf_counter()
    for e in exprs:
        env.simplify(e)
    env_cold = time.perf_counter() - t0
    t0 = time.perf_counter()
    for _ in range(10):
        for e in exprs:
            env.simplify(e)
    env_warm = (time.perf_counter() - t0) / 10

    t0 = time.perf_counter()
    for e in out:
        python_code(e)
        cpp_code(e, ranges=ranges)
        triton_code(e, ranges=ranges)
    printing = time.perf_counter() - t0

    n = len(exprs)
    print(f"{n} index expressions ({changed} changed by range rules)")
    print(f"range-aware simplification, cold: {n / cold:,.0f} expr/s ({cold / n * 1e6:.0f} us each)")
    print(f"ShapeEnv.simplify, first call:   {n / env_cold:,.0f} expr/s")
    print(f"ShapeEnv.simplify, cached:       {n / env_warm:,.0f} expr/s")
    print(f"print Python + C++ + Triton:     {n / printing:,.0f} expr/s (all three)")
    for e, s in list(zip(exprs, out))[:6]:
        print(f"  {e}  ->  {s}")


if __name__ == "__main__":
    main()
