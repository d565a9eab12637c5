"""cudagraphify: replayed results match plain calls on fresh inputs, inputs kept in place are
not copied, new signatures record new graphs (bounded), outputs survive the next call (handed out
as aliases of graph memory that no replay overwrites while they are in use), and everything a
graph cannot serve runs plainly. The recording tests need a CUDA GPU."""

import logging

import pytest
import torch

from fireclay_triton import CudaGraphed, cudagraphify
from fireclay_triton.cudagraphs import hand_out, plan_outputs

cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")


def affine_gelu(x, w):
    return (torch.nn.functional.gelu(x @ w + 1.0), x.sum(0))


@pytest.mark.parametrize("args", [
    (torch.randn(4, 3), torch.randn(3, 5)),  # CPU tensors
    (torch.randn(4, 3), 2.5),  # a constant beside a CPU tensor
], ids=["cpu_tensors", "cpu_and_constant"])
def test_calls_a_graph_cannot_serve_run_plainly(args, caplog):
    def fn(x, w):
        return (x * w,) if not isinstance(w, torch.Tensor) else affine_gelu(x, w)
    graphed = cudagraphify(fn, list(args))
    assert isinstance(graphed, CudaGraphed)
    with caplog.at_level(logging.INFO, logger="fireclay_triton"):
        for _ in range(3):
            got, want = graphed(*args), fn(*args)
            assert type(got) is tuple and len(got) == len(want)
            for g, w in zip(got, want):
                torch.testing.assert_close(g, w)
    assert graphed.plain_calls == 3 and graphed.recordings == 0
    mine = [r for r in caplog.records if r.name == "fireclay_triton"]  # (not the umbrella's forwarded copy)
    assert sum("CUDA graphs off" in r.getMessage() for r in mine) == 1  # logged once per cause
    assert "not a CUDA device" in caplog.text or "no CUDA tensor" in caplog.text


def test_unsupported_argument_kinds_run_plainly():
    graphed = cudagraphify(lambda x, xs: (x + len(xs),), None)
    x = torch.ones(3)
    torch.testing.assert_close(graphed(x, [1, 2])[0], x + 2)
    assert graphed.plain_calls == 1


@cuda
def test_replays_match_plain_calls_on_fresh_inputs():
    w = torch.randn(64, 32, device="cuda")
    graphed = cudagraphify(affine_gelu, [torch.randn(16, 64, device="cuda"), w])
    for seed in range(5):
        x = torch.randn(16, 64, device="cuda", generator=torch.Generator("cuda").manual_seed(seed))
        got, want = graphed(x, w), affine_gelu(x, w)
        for g, e in zip(got, want):
            torch.testing.assert_close(g, e)
        del got, g  # (held across the next call, a second pool would serve it)
    assert (graphed.recordings, graphed.plain_calls, graphed.replays) == (1, 1, 4)
    (rec,) = graphed.graphs.values()
    assert rec.copied == [0] and list(rec.in_place) == [1]  # the weight is read in place, not copied


@cuda
def test_inputs_kept_in_place_are_read_where_they_are():
    w = torch.randn(8, 8, device="cuda")
    graphed = cudagraphify(lambda x, w: (x @ w,), None)
    x = torch.randn(4, 8, device="cuda")
    for _ in range(3):
        graphed(x, w)  # (results dropped at once: one pool serves)
    with torch.no_grad():
        w.mul_(2.0)  # an optimizer step: same storage, new values
    torch.testing.assert_close(graphed(x, w)[0], x @ w)
    w2 = torch.randn(8, 8, device="cuda")  # elsewhere: another graph reads it there
    torch.testing.assert_close(graphed(x, w2)[0], x @ w2)
    torch.testing.assert_close(graphed(x, w)[0], x @ w)
    (rec,) = graphed.graphs.values()
    assert rec.copied == [] and list(rec.in_place) == [0, 1] and graphed.recordings == 2
    ws = [torch.randn(8, 8, device="cuda") for _ in range(5)]  # always elsewhere: copied from then on
    for w in ws + ws:
        torch.testing.assert_close(graphed(x, w)[0], x @ w)
    (rec,) = graphed.graphs.values()
    assert rec.copied == [1] and list(rec.in_place) == [0] and graphed.recordings == 5


@cuda
def test_new_signature_records_a_new_graph_up_to_the_bound(caplog):
    def fn(x):
        return (torch.softmax(x, -1) * 2,)
    graphed = cudagraphify(fn, None, max_graphs=2)
    shapes = [(4, 16), (8, 16), (4, 16), (3, 5), (8, 16), (3, 5), (3, 5)]
    with caplog.at_level(logging.INFO, logger="fireclay_triton"):
        for i, shape in enumerate(shapes):
            x = torch.randn(shape, device="cuda", generator=torch.Generator("cuda").manual_seed(i))
            torch.testing.assert_close(graphed(x)[0], fn(x)[0])  # (the result is dropped: one pool)
    assert graphed.recordings == 2 and len(graphed.graphs) == 2
    assert "max_graphs" in caplog.text
    x = torch.randn(8, 16, device="cuda").t()  # same shape as a recorded one, other strides: another signature
    torch.testing.assert_close(graphed(x)[0], fn(x)[0])


@cuda
@pytest.mark.parametrize("copy_outputs", [True, False])
def test_outputs_survive_the_next_call_unless_asked_otherwise(copy_outputs):
    def fn(x):
        return (x * 3, (x + 1).t(), 7)
    graphed = cudagraphify(fn, None, copy_outputs=copy_outputs)
    xs = [torch.randn(6, 5, device="cuda") for _ in range(5)]
    outs = [graphed(x) for x in xs]
    assert outs[-1][2] == 7 and outs[-1][1].stride() == fn(xs[-1])[1].stride()
    if copy_outputs:  # warm-up, a graph per pool while results are held, then plain calls
        assert (graphed.plain_calls, graphed.recordings, graphed.replays) == (3, 2, 2)
        for x, out in zip(xs, outs):
            torch.testing.assert_close(out[0], x * 3)
            torch.testing.assert_close(out[1], (x + 1).t())
    else:  # the graph's own memory: the last replay's values in every replayed result
        assert outs[3][0].data_ptr() == outs[4][0].data_ptr()
        torch.testing.assert_close(outs[3][0], xs[4] * 3)


@cuda
@pytest.mark.parametrize("keep", ["nothing", "previous", "a_view", "detached", "a_dtype_view", "two"])
def test_a_replay_never_overwrites_an_output_in_use(keep):
    """A loop that keeps what it is given (the previous result, a view or a detached copy of it,
    the last two results) gets correct values in everything it kept, and replays stay graphed
    where a free pool exists."""
    def fn(x):
        return (torch.relu(x) * 2, x.sum(1))
    graphed = cudagraphify(fn, None)
    kept: list = []
    xs = [torch.randn(64, 32, device="cuda", generator=torch.Generator("cuda").manual_seed(i)) for i in range(8)]
    for x in xs:
        out = graphed(x)
        if keep == "previous":
            kept = [(x, out[0], lambda t: t)]
        elif keep == "a_view":
            kept = [(x, out[0][3:, 1:], lambda t: t[3:, 1:])]
        elif keep == "detached":
            kept = [(x, out[1].detach(), lambda t: t)]
        elif keep == "a_dtype_view":
            kept = [(x, out[0].view(torch.int32), lambda t: t.view(torch.int32))]
        elif keep == "two":
            kept = kept[-1:] + [(x, out[0], lambda t: t)]
        del out
        for kx, value, derive in kept:
            want = fn(kx)[0 if keep != "detached" else 1]
            assert torch.equal(value, derive(want))
    # (keeping the last two results: every third call finds both pools in use and runs plainly)
    assert graphed.plain_calls == (1 if keep != "two" else 3)
    assert len(graphed.pools) == (1 if keep == "nothing" else 2)


def test_outputs_are_handed_out_as_aliases_of_their_storage():
    """What a replay hands out, on CPU tensors: every output (mixed dtypes, a transposed view, a
    strided slice, two views of one storage, an empty tensor, a constant, an input returned) back
    with its values and strides, in memory of its own storage object, except the copied ones."""
    gen = torch.Generator().manual_seed(0)
    base = torch.randn(4, 6, generator=gen)
    given = torch.randn(3, generator=gen)
    outs = (torch.randn(3, 5, generator=gen), base.t(), 7, torch.arange(5), base[:, ::2], torch.zeros(0, 3),
            torch.rand(4, generator=gen) > 0.5, torch.randn(3, generator=gen).half(), given, base.view(torch.int32),
            torch.randn(3, dtype=torch.complex64, generator=gen).conj())
    storages, plans = plan_outputs(outs, {given.untyped_storage().data_ptr()})
    assert len(storages) == 5  # base's storage once
    got, weak = hand_out(outs, storages, plans)
    for want, g in zip(outs, got):
        if not isinstance(want, torch.Tensor):
            assert g == want
            continue
        assert g.dtype == want.dtype and g.stride() == want.stride() and torch.equal(g, want)
        if want.numel() and want is not given and not want.is_conj():
            assert g.data_ptr() == want.data_ptr() and g.untyped_storage() is not want.untyped_storage()
    assert got[8].data_ptr() != given.data_ptr()  # an input returned is copied
    assert not any(w.expired() for w in weak)
    view = got[4][1:]
    del got, g
    assert sum(not w.expired() for w in weak) == 1  # the storage a view still uses
    del view
    assert all(w.expired() for w in weak)


@cuda
def test_outputs_of_a_graph_are_read_in_place_by_the_next():
    """A backward reading the tensors its forward saved: they live in graph memory, where they stay,
    so the second callable's graphs read them in place (no copy), from either of the forward's
    pools, and its results are right."""
    forward = cudagraphify(lambda x, w: (torch.tanh(x @ w), x * 2), None)
    backward = cudagraphify(lambda saved, g: (g * (1 - saved * saved),), None)
    w = torch.randn(16, 16, device="cuda")
    held = None
    for i in range(8):
        x = torch.randn(4, 16, device="cuda", generator=torch.Generator("cuda").manual_seed(i))
        out = forward(x, w)
        grad = backward(out[0], torch.ones_like(out[0]))[0]
        torch.testing.assert_close(grad, 1 - torch.tanh(x @ w) ** 2)
        held = out  # (held across the next call: the forward alternates between its pools)
    assert len(forward.pools) == 2 and held is not None
    recorded = [rec for pool in backward.pools for variants in pool.graphs.values() for rec in variants]
    # (the gradient, a fresh tensor, may or may not come back at one address: not asserted)
    assert len(recorded) >= 2 and all(0 in rec.in_place for rec in recorded)


@cuda
def test_inputs_needing_gradients_run_plainly():
    graphed = cudagraphify(lambda x: (x * 2,), None)
    x = torch.randn(3, device="cuda", requires_grad=True)
    for _ in range(3):
        out = graphed(x)[0]
    out.sum().backward()
    torch.testing.assert_close(x.grad, torch.full_like(x, 2.0))
    assert graphed.recordings == 0
    with torch.no_grad():
        for _ in range(3):
            torch.testing.assert_close(graphed(x)[0], x * 2)
    assert graphed.recordings == 1
