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
    # (abs, not a transcendental op: those are stored rather than recomputed per broadcast read)
    s = b.call("add.Tensor", b.call("abs.default", x), y)
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


def rotary_tables(b, x, y):
    # cos and sin of positions x inv_freq [S, D], read broadcast by every batch row and head of
    # the [B, H, S, D] rotation (rotary embeddings)
    angles = b.call("mul.Tensor", b.call("unsqueeze.default", x, 1), b.call("unsqueeze.default", y, 0))
    cos, sin = b.call("cos.default", angles), b.call("sin.default", angles)
    return b.call("add.Tensor", b.call("mul.Tensor", cos, 2.0), b.call("expand.default", sin, [3, 4, 6, 5]))


def test_transcendental_producers_read_broadcast_are_stored_once():
    """Recomputing cos/sin of the rotary angles inside the [B, H, S, D] consumer would run them
    B*H times over; they are stored once (cheap producers are still recomputed)."""
    gen = torch.Generator().manual_seed(0)
    b = AtenBuilder()
    x, y = b.input(torch.randn(6), "x"), b.input(torch.randn(5), "y")
    program = b.output(rotary_tables(b, x, y))
    scheduled = schedule(lower(program))
    kept = [d for d in scheduled.decisions if d.action == "keep apart" and "transcendental" in d.reason]
    assert kept, [str(d) for d in scheduled.decisions]
    assert not any(d.action == "inline" and d.first in {k.first for k in kept} for d in scheduled.decisions)
    for _ in range(3):
        fresh = [torch.randn(6, generator=gen), torch.randn(5, generator=gen)]
        torch.testing.assert_close(run(scheduled, *fresh)[0], b.eager(*fresh)[0])


def test_padded_windows_recompute_producers_at_plain_indices():
    """A padded max pool recomputes batch norm and relu at each window point; the window's first
    row and column lie before the producer's buffer, where only the mask keeps the load out.
    The producer's indices are the window's own (2*y - 1 + k), not ``(i // s) % n`` of a flat
    position that can be negative (that div/mod kept the pooling loop scalar), and the result
    is eager's."""
    from conv_programs import PROGRAMS, build, tolerance

    from fireclay_loops import exprs

    case = next(c for c in PROGRAMS if c.name == "stem_padded_pool")
    program, b, make_inputs = build(case, torch.float32, seed=3)
    scheduled = schedule(lower(program, channels_last=True))
    assert any(d.action == "inline" for d in scheduled.decisions)
    pooled = [k for k in scheduled.kernels for kn in k.nodes
              if any("max_pool2d" in o for o in kn.node.meta.get("origins", []))]
    assert pooled
    for kernel in pooled:
        for kn in kernel.nodes:
            for op in kn.node.body.ops:
                if op.name in ("load", "masked_load"):
                    assert not op.args[1].atoms(exprs.FloorDiv, exprs.Mod), op.args[1]
    for _ in range(3):
        inputs = make_inputs()
        torch.testing.assert_close(run(scheduled, *inputs)[0], b.eager(*inputs)[0], **tolerance(torch.float32))
