"""Chains of recomputed producers: ``p2`` is a cheap producer recomputed inside its consumer
``c``, and ``p1``, which fed ``p2``, is then recomputed inside ``c`` too (producers are visited
after their consumers). Inlining replaces ``c`` by a new version; the pass must then work on
that version (an earlier version iterated a stale copy of the node list and failed with
``list.remove(x): x not in list`` on T5's and Swin's relative-position code)."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from aten_builder import AtenBuilder  # noqa: E402

from fireclay_loops import lower, schedule  # noqa: E402
from fireclay_loops.reference import run  # noqa: E402


def broadcast_then_flip(b, x, y):
    # neg(x) [3] is read broadcast by the [5, 3] add; the add is read flipped by the product
    s = b.call("add.Tensor", b.call("neg.default", x), y)
    c = b.call("flip.default", s, [0])
    return b.call("mul.Tensor", c, c)


def three_deep(b, x, y):
    # three producers in a chain, each read at an index the next cannot share a kernel over
    s = b.call("add.Tensor", b.call("sin.default", x), y)
    t = b.call("flip.default", b.call("mul.Tensor", s, s), [0])
    u = b.call("flip.default", b.call("tanh.default", t), [1])
    return b.call("sub.Tensor", u, y)


CASES = [(broadcast_then_flip, (3,), (5, 3)), (three_deep, (3,), (5, 3)),
         (broadcast_then_flip, (1, 4), (6, 4))]


@pytest.mark.parametrize("build,xs,ys", CASES, ids=["flip", "three_deep", "flip_2d"])
def test_chained_inlining_matches_eager(build, xs, ys):
    gen = torch.Generator().manual_seed(len(build.__name__))
    b = AtenBuilder()
    x, y = b.input(torch.randn(xs), "x"), b.input(torch.randn(ys), "y")
    program = b.output(build(b, x, y))
    scheduled = schedule(lower(program))
    inlined = [d for d in scheduled.decisions if d.action == "inline"]
    # a chain: some consumer takes two recomputed producers, the second into its new version,
    # and no buffer of the chain is left for it to read
    consumers = [d.second for d in inlined]
    assert any(consumers.count(c) >= 2 for c in consumers)
    assert len(scheduled.kernels) == 1
    for _ in range(3):
        fresh = [torch.randn(xs, generator=gen), torch.randn(ys, generator=gen)]
        torch.testing.assert_close(run(scheduled, *fresh)[0], b.eager(*fresh)[0])
