"""Dynamic shapes: automatic dynamic after a size change, mark_dynamic with bounds, dynamic=True;
symbolic graphs stay equal to eager on every size they accept."""

from __future__ import annotations

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

from fireclay_capture import capture, mark_dynamic


def reshape_by_size(x, y):
    n = x.shape[0]
    z = torch.relu(x + y * 2).view(n * 2, -1)
    return z.sum(0), n, x.shape


def mlp_on_batch(x):
    h = F.gelu(x @ torch.ones(x.shape[-1], 8))
    return h.mean(-1), h.size(0) * 2


def concat_and_slice(x):
    y = torch.cat([x, x * 2], dim=0)
    return y[: x.shape[0] + 1], y.narrow(0, 1, x.size(0))


def loop_over_fixed_dim(x):
    out = x
    for i in range(x.shape[1]):  # static dim: unrolled
        out = out + i
    return out.reshape(-1)


FUNCTIONS = [reshape_by_size, mlp_on_batch, concat_and_slice, loop_over_fixed_dim]


def _inputs(fn, n):
    if fn is reshape_by_size:
        return (torch.randn(n, 4), torch.randn(n, 4))
    return (torch.randn(n, 4),)


def _same(a, b):
    if isinstance(b, torch.Tensor):
        torch.testing.assert_close(a, b)
    elif isinstance(b, (tuple, list)):
        assert type(a) is type(b) and len(a) == len(b)
        for x, y in zip(a, b):
            _same(x, y)
    else:
        assert a == b and type(a) is type(b)


@pytest.mark.parametrize("fn", FUNCTIONS, ids=[f.__name__ for f in FUNCTIONS])
def test_automatic_dynamic_recompiles_once(fn):
    cf = capture(fn, fullgraph=True)
    for n in (3, 4, 5, 7, 9):
        args = _inputs(fn, n)
        _same(cf(*args), fn(*args))
    assert (cf.stats.captures, cf.stats.recompiles) == (2, 1)
    assert cf.last_program.symbols, "the second capture is symbolic"


@pytest.mark.parametrize("fn", FUNCTIONS, ids=[f.__name__ for f in FUNCTIONS])
def test_dynamic_true_captures_once(fn):
    cf = capture(fn, fullgraph=True, dynamic=True)
    for n in (3, 4, 6, 10):
        args = _inputs(fn, n)
        _same(cf(*args), fn(*args))
    assert cf.stats.captures == 1


def test_size_one_is_specialised():
    cf = capture(mlp_on_batch, fullgraph=True, dynamic=True)
    for n in (3, 5, 1, 1):
        x = torch.randn(n, 4)
        _same(cf(x), mlp_on_batch(x))
    assert cf.stats.captures == 2  # one symbolic graph, one for n == 1


def test_mark_dynamic_with_bounds():
    cf = capture(mlp_on_batch, fullgraph=True)
    for n in (4, 6, 8):
        x = torch.randn(n, 4)
        mark_dynamic(x, 0, min=2, max=8)
        _same(cf(x), mlp_on_batch(x))
    assert cf.stats.captures == 1
    program = cf.last_program
    assert [(s.min, s.max) for s in program.symbols.values()] == [(2, 8)]
    x = torch.randn(12, 4)  # outside the declared range: the guard fails, re-capture
    _same(cf(x), mlp_on_batch(x))
    assert cf.stats.captures == 2


def test_mark_dynamic_rejects_bad_dim():
    with pytest.raises(IndexError, match="out of range"):
        mark_dynamic(torch.randn(2, 3), 2)


def test_duck_sized_inputs_recapture_when_sizes_diverge():
    cf = capture(reshape_by_size, fullgraph=True, dynamic=True)
    x, y = torch.randn(4, 6), torch.randn(4, 6)
    _same(cf(x, y), reshape_by_size(x, y))
    # x and y dims of equal size shared one symbol; sizes that differ must not reuse that graph
    # (they fail eagerly too, so only check that the guard rejects them).
    entry = cf.cache.entries[0]
    assert entry.guards({"x": torch.randn(5, 6), "y": torch.randn(7, 6)}) is None
    assert entry.guards({"x": torch.randn(6, 6), "y": torch.randn(6, 6)}) is not None


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(4, 4)

    def forward(self, x):
        b, t, _ = x.shape
        return self.lin(x).reshape(b * t, 4).softmax(-1)


def test_module_with_dynamic_batch_and_sequence():
    m = Net().eval()
    cf = capture(m, fullgraph=True, dynamic=True)
    for b, t in ((2, 3), (3, 5), (4, 2)):
        x = torch.randn(b, t, 4)
        _same(cf(x), m(x))
    assert cf.stats.captures == 1
    graph = cf.last_program.main
    assert any(isinstance(d, str) for d in graph.inputs[0].meta.shape)
