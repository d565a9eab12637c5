"""Property tests of the whole decide-and-guard loop.

A random "trace" creates sizes from random hints (with duck sizing and 0/1 specialisation),
computes random expressions with SymbolicInts and takes random decisions on them. Then, for
random new sizes, the rendered guard must accept exactly when replaying the same trace on plain
ints takes the same decisions and the same specialisations hold.
"""

import random

from exprgen import OPS, concrete, random_divisor, symbolic
from hypothesis import given, settings
from hypothesis import strategies as st

from fireclay_shapes import ShapeEnv

SOURCES = ["L['a'].size()[0]", "L['a'].size()[1]", "L['b'].size()[0]", "L['b'].size()[1]", "L['c'].size()[0]"]
RELATIONS = ["<", "<=", "==", "!=", ">", ">="]


def compare(op, a, b):
    return {"<": a < b, "<=": a <= b, "==": a == b, "!=": a != b, ">": a > b, ">=": a >= b}[op]


def random_size_tree(rng, depth):
    """Like exprgen.random_tree, over size leaves p0..p4 (one per SOURCE)."""
    if depth == 0 or rng.random() < 0.3:
        if rng.random() < 0.25:
            return ("const", rng.randint(-5, 12))
        return ("sym", f"p{rng.randrange(len(SOURCES))}")
    op = rng.choice(OPS)
    if op == "neg":
        return ("neg", random_size_tree(rng, depth - 1))
    a = random_size_tree(rng, depth - 1)
    if op in ("floordiv", "mod"):
        b = random_divisor(rng)
        b = ("const", rng.choice([1, 2, 3, 4, 8])) if b[0] != "const" else b
        return (op, a, b)
    return (op, a, random_size_tree(rng, depth - 1))


class Box:
    def __init__(self, *sizes):
        self.sizes = sizes

    def size(self):
        return self.sizes


def run_guard(code, sizes):
    frame = {"a": Box(sizes[0], sizes[1]), "b": Box(sizes[2], sizes[3]), "c": Box(sizes[4])}
    return eval(code, {"__builtins__": {"max": max, "min": min}}, {"L": frame})


def random_hints(rng):
    pool = [rng.choice([0, 1, 2, 3, 4, 5, 8]) for _ in range(3)]
    return [rng.choice(pool + [rng.randint(0, 12)]) for _ in SOURCES]


@given(st.integers(0, 2**32))
@settings(max_examples=80, deadline=None)
def test_rendered_guards_accept_exactly_the_same_trace(seed):
    rng = random.Random(seed)
    hints = random_hints(rng)
    env = ShapeEnv()
    leaves = {f"p{i}": env.create_symint(h, src) for i, (h, src) in enumerate(zip(hints, SOURCES))}
    decisions = []
    for _ in range(rng.randint(1, 6)):
        a, b = random_size_tree(rng, 2), random_size_tree(rng, 2)
        op = rng.choice(RELATIONS)
        outcome = bool(compare(op, symbolic(a, leaves), symbolic(b, leaves)))
        decisions.append((op, a, b, outcome))
        if rng.random() < 0.15:
            t = random_size_tree(rng, 1)
            decisions.append(("int", t, None, int(symbolic(t, leaves))))
    text = env.render_guards()
    code = compile(text, "<guard>", "eval")
    hint_values = {f"p{i}": h for i, h in enumerate(hints)}
    groups: dict[int, list[int]] = {}
    for i, h in enumerate(hints):
        groups.setdefault(h, []).append(i)

    def same_trace(sizes) -> bool:
        values = {f"p{i}": v for i, v in enumerate(sizes)}
        for h, v in zip(hints, sizes):
            if (h in (0, 1) or v in (0, 1)) and h != v:
                return False  # 0/1 specialisation
        for members in groups.values():  # duck sizing: equal hints were one symbol
            if len({sizes[i] for i in members}) > 1:
                return False
        for op, a, b, outcome in decisions:
            if op == "int":
                if concrete(a, values) != outcome:
                    return False
            elif compare(op, concrete(a, values), concrete(b, values)) != outcome:
                return False
        return True

    assert run_guard(code, hints) and same_trace(hints)
    accepted = 0
    for trial in range(60):
        if trial < 20:  # near the hints, where guards bite
            sizes = [max(0, h + rng.randint(-2, 2)) for h in hints]
            if rng.random() < 0.5:
                for members in groups.values():
                    for i in members[1:]:
                        sizes[i] = sizes[members[0]]
        else:
            sizes = [rng.randint(0, 16) for _ in hints]
            for members in groups.values():
                if rng.random() < 0.7:
                    for i in members[1:]:
                        sizes[i] = sizes[members[0]]
        want = same_trace(sizes)
        accepted += want
        assert run_guard(code, sizes) == want, (text, hint_values, sizes, decisions)
    assert env.check({s: hint_values[f"p{SOURCES.index(info.sources[0])}"]
                      for s, info in env.symbols.items()})


@given(st.integers(0, 2**32))
@settings(max_examples=60, deadline=None)
def test_simplified_guard_set_accepts_exactly_what_the_full_set_accepts(seed):
    rng = random.Random(seed)
    env = ShapeEnv(duck_sizing=False)
    leaves = {f"p{i}": env.create_symint(rng.randint(2, 12), src) for i, src in enumerate(SOURCES)}
    for _ in range(rng.randint(2, 8)):
        a, b = random_size_tree(rng, 2), random_size_tree(rng, 1)
        bool(compare(rng.choice(RELATIONS), symbolic(a, leaves), symbolic(b, leaves)))
    full = env.guards
    declared = {info.symbol: info.declared for info in env.symbols.values()}
    simple = full.simplified(declared)
    assert len(simple) <= len(full)
    for _ in range(60):
        values = {f"s{i}": rng.randint(2, 16) for i in range(len(SOURCES))}
        assert full.evaluate(values) == simple.evaluate(values), (full.dumps(), simple.dumps(), values)
