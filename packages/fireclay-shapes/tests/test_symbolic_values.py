"""SymbolicInt arithmetic agrees with Python ints: at the hints, and at any values that
satisfy the guards the computation recorded."""

import random
import subprocess
import sys

from exprgen import RANGES, concrete, random_tree, random_values, symbolic, sympy_value
from hypothesis import given, settings
from hypothesis import strategies as st

from fireclay_shapes import ShapeEnv, SymbolicInt


def make_leaves(env: ShapeEnv, hints: dict[str, int]):
    # Sizes-like symbols for the positive names; the "any sign" names get explicit ranges.
    leaves = {}
    for name, hint in hints.items():
        lo, hi = RANGES[name]
        leaves[name] = env.create_symint(hint, name, min=lo, max=hi)
    return leaves


@given(st.integers(0, 2**32))
@settings(max_examples=150, deadline=None)
def test_symbolic_evaluation_agrees_with_concrete(seed):
    rng = random.Random(seed)
    tree = random_tree(rng)
    hints = random_values(rng)
    env = ShapeEnv(specialize_zero_one=False)
    leaves = make_leaves(env, hints)
    result = symbolic(tree, leaves)
    want = concrete(tree, hints)
    got = result.hint if isinstance(result, SymbolicInt) else result
    assert got == want
    if not isinstance(result, SymbolicInt):
        return
    names = {f"s{i}": n for i, n in enumerate(hints)}
    for _ in range(10):
        values = random_values(rng)
        by_symbol = {s: values[n] for s, n in names.items()}
        if env.check(by_symbol):
            # symbols s0, s1, ... were made in the order of ``hints``
            assert sympy_value(result.expr, by_symbol) == concrete(tree, values)
            assert sympy_value(env.simplify(result.expr), by_symbol) == concrete(tree, values)


def test_importing_the_package_does_not_import_torch():
    code = "import sys, fireclay_shapes; assert 'torch' not in sys.modules; print('ok')"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert out.stdout.strip() == "ok", out.stderr


def test_torch_adapter_says_it_needs_torch_when_torch_is_missing():
    code = ("import sys; sys.modules['torch'] = None\n"
            "try:\n    import fireclay_shapes.torch\nexcept ImportError as e:\n    print(e)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert "needs torch installed" in out.stdout, out.stderr
