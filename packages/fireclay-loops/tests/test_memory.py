"""Memory planning: lifetimes, reuse, and the rules for inputs and outputs."""

import pytest
from hand import Hand, t

from fireclay_loops import lower, schedule


def chain(n_ops: int = 4, donate: bool = False, also_return_first: bool = False):
    h = Hand()
    x = h.input("x", 4, 8)
    v, first = x, None
    for op in ["exp.default", "sin.default", "neg.default", "cos.default", "tanh.default"][:n_ops]:
        v = h.op(op, v, out=t(4, 8))
        first = first or v
    outs = (v, first) if also_return_first else (v,)
    return schedule(lower(h.program(*outs), donated=[0] if donate else []), fusion=False)


def test_unfused_chain_reuses_dead_buffers():
    s = chain(4)
    plan = s.plan
    # buf0 dies after kernel1, buf1 after kernel2: buf2 and buf3 take their memory.
    assert [(b, prev) for b, prev, _ in plan.reuses] == [("buf2", "buf0"), ("buf3", "buf1")]
    assert len({plan.buffer_allocation[b] for b in ("buf0", "buf1", "buf2", "buf3")}) == 2
    assert plan.peak_bytes == 3 * 128


def test_inputs_are_not_reused_unless_donated():
    s = chain(3)
    assert all(prev != "in_x" for _, prev, _ in s.plan.reuses)
    donated = chain(3, donate=True)
    assert ("buf1", "in_x", "mem_in_x") in donated.plan.reuses


def test_outputs_are_never_reused():
    s = chain(5, also_return_first=True)
    out_allocs = {s.plan.buffer_allocation[o] for o in s.program.outputs}
    for b, alloc in s.plan.buffer_allocation.items():
        if b not in s.program.outputs:
            assert alloc not in out_allocs or s.plan.lifetimes[b][1] < s.plan.lifetimes[
                next(o for o in s.program.outputs if s.plan.buffer_allocation[o] == alloc)][0]


def test_lifetimes_cover_every_reader():
    s = chain(4)
    for k, step in enumerate(s.steps):
        for b in step.read_buffers():
            first, last = s.plan.lifetimes[b]
            assert first < k <= last


def test_sizes_must_fit_to_reuse():
    h = Hand()
    x = h.input("x", 4, 8)
    a = h.op("exp.default", x, out=t(4, 8))
    small = h.op("sum.dim_IntList", a, [1], out=t(4))
    col = h.op("unsqueeze.default", small, 1, out=t(4, 1))
    big = h.op("expand.default", col, [4, 16], out=t(4, 16))
    c = h.op("mul.Tensor", big, 2.0, out=t(4, 16))
    s = schedule(lower(h.program(c)), fusion=False)
    for b, _prev, alloc in s.plan.reuses:
        need = s.program.hint(s.program.buffers[b].nbytes)
        assert need <= s.program.hint(s.plan.allocations[alloc].nbytes)


def test_reuse_is_correct_when_run():
    torch = pytest.importorskip("torch")
    from fireclay_loops.reference import run

    for donate in (False, True):
        s = chain(5, donate=donate, also_return_first=True)
        x = torch.randn(4, 8)
        first = x.exp()
        last = first.sin().neg().cos().tanh()
        got = run(s, x.clone())
        torch.testing.assert_close(got[0], last)
        torch.testing.assert_close(got[1], first)


def test_a_wrong_plan_gives_wrong_results():
    # The reference executor really shares memory between buffers of one allocation: putting
    # the last output in the memory of a buffer that is still needed (here another output)
    # breaks the result, so the tests above would notice a planner that reused too eagerly.
    torch = pytest.importorskip("torch")
    from fireclay_loops.reference import run

    h = Hand()
    x = h.input("x", 4, 8)
    a = h.op("exp.default", x, out=t(4, 8))
    b = h.op("flip.default", a, [0], out=t(4, 8))
    c = h.op("add.Tensor", b, 1.0, out=t(4, 8))
    s = schedule(lower(h.program(c, a)), fusion=False)
    xv = torch.randn(4, 8)
    want = (xv.exp().flip(0) + 1, xv.exp())
    got = run(s, xv)
    torch.testing.assert_close(got[0], want[0])
    plan = s.plan
    out = s.program.outputs[0]
    plan.buffer_allocation[out] = plan.buffer_allocation["buf0"]
    bad = run(s, xv)
    assert not torch.allclose(bad[1], want[1])
