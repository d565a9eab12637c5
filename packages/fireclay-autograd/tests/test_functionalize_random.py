"""Random programs of views and in-place writes through them: functionalization must give
eager's values for every snapshot read along the way, with and without gradients."""

from __future__ import annotations

import random

import pytest
import torch
from fx_programs import program_from
from helpers import check_against_eager

from fireclay_autograd import trace_to_aten
from fireclay_autograd.executor import aten_overload


def _views(t: torch.Tensor) -> list:
    """View functions valid for a tensor shaped like ``t``."""
    out = []
    if t.dim() == 2:
        r, c = t.shape
        if r >= 2:
            out += [lambda x: x[1:], lambda x: x[0]]
        if c >= 2:
            out += [lambda x: x[:, ::2], lambda x: x.select(1, c - 1)]
        out += [lambda x: x.t()]
        if r == c:
            out += [lambda x: x.diagonal()]
    elif t.dim() == 1:
        if t.shape[0] >= 2:
            out += [lambda x: x[1:], lambda x: x[::2]]
        out += [lambda x: x.unsqueeze(0)]
    return out


WRITES = [
    lambda v: v.add_(1.5),
    lambda v: v.mul_(-2.0),
    lambda v: v.zero_(),
    lambda v: v.fill_(0.25),
    lambda v: v.sub_(v * 0.5),
    lambda v: v.clamp_(-0.5, 0.5),
    lambda v: v.exp_(),
]
# Writes whose backward saves nothing, so a later write cannot invalidate it (eager would
# refuse to differentiate such a program).
LINEAR_WRITES = WRITES[:5]


def random_program(seed: int, writes: list = WRITES):
    """A recipe (list of steps) chosen with real tensors so every view is valid, and the
    function replaying it."""
    rng = random.Random(seed)
    probe = [torch.zeros(4, 6)]
    steps = []
    for _ in range(rng.randint(2, 5)):
        src = rng.randrange(len(probe))
        chain = []
        t = probe[src]
        for _ in range(rng.randint(1, 2)):
            options = _views(t)
            if not options:
                break
            view = rng.choice(options)
            chain.append(view)
            t = view(t)
        probe.append(t)
        steps.append((src, chain, rng.choice(writes), rng.randrange(len(probe))))

    def fn(x):
        aliases = [x.clone()]
        snapshots = []
        for src, chain, write, read in steps:
            v = aliases[src]
            for view in chain:
                v = view(v)
            aliases.append(v)
            write(v)
            snapshots.append(aliases[read] * 1)
        return (aliases[0], *snapshots)

    return fn


SEEDS = list(range(40))


@pytest.mark.parametrize("seed", SEEDS)
def test_random_view_mutation_programs(seed):
    fn = random_program(seed)
    x = torch.randn(4, 6)
    aten = trace_to_aten(program_from(fn, [x.clone()]), [x.clone()])
    assert all(not aten_overload(n.op)._schema.is_mutable for n in aten.main.nodes)
    check_against_eager(fn, [x], grad=False)


@pytest.mark.parametrize("seed", SEEDS[::2])
def test_random_view_mutation_programs_differentiate(seed):
    fn = random_program(seed, LINEAR_WRITES)
    check_against_eager(fn, [torch.randn(4, 6, requires_grad=True)], atol=1e-5, rtol=1e-5)
