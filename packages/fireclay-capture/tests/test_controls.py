"""graph_break(), disable(), allow_in_graph(), is_compiling(), checked against eager."""

from __future__ import annotations

import pytest
import torch

from fireclay_capture import allow_in_graph, capture, disable, graph_break, is_compiling

CALLS = []


@allow_in_graph
def gated(a, b):
    CALLS.append("gated")
    return a * torch.sigmoid(b)


@disable
def eager_only(t):
    CALLS.append("eager_only")
    return t.tolist()


def uses_gated(x, y):
    return gated(x + 1, y).sum(0)


def uses_eager_only(x, y):
    z = x * y
    values = eager_only(z)
    return z + len(values)


def forced_breaks(x, y):
    a = x.sin()
    graph_break()
    b = a + y
    graph_break()
    return b.cos()


def branches_on_is_compiling(x, y):
    if is_compiling() and torch.compiler.is_compiling():
        return x + y
    return y + x


CASES = {
    # name: (fn, fullgraph possible, graphs, breaks)
    "uses_gated": (uses_gated, True, 1, 0),
    # the resume function guards on the list of floats eager_only returned: one per call
    "uses_eager_only": (uses_eager_only, False, 4, 1),
    "forced_breaks": (forced_breaks, False, 3, 2),
    "branches_on_is_compiling": (branches_on_is_compiling, True, 1, 0),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_control_matches_eager(name):
    fn, fullgraph, graphs, breaks = CASES[name]
    compiled = capture(fn, fullgraph=fullgraph)
    for _ in range(3):
        x, y = torch.randn(3, 2), torch.randn(3, 2)
        torch.testing.assert_close(compiled(x, y), fn(x, y))
    assert (compiled.graph_count(), compiled.break_count(), compiled.stats.fallbacks) == (graphs, breaks, 0)


def test_allow_in_graph_is_one_opaque_node():
    compiled = capture(uses_gated, fullgraph=True)
    compiled(torch.randn(3, 2), torch.randn(3, 2))
    ops = [n.op for n in compiled.last_program.graphs["main"].nodes]
    assert ops == ["torch::operator.add", f"torch::{gated._fireclay_allowed_op}", "torch::Tensor.sum"]


def test_disable_runs_eagerly_once_per_call():
    compiled = capture(uses_eager_only)
    CALLS.clear()
    for _ in range(3):
        compiled(torch.randn(3, 2), torch.randn(3, 2))
    assert CALLS == ["eager_only"] * 3


def test_is_compiling_is_false_outside_a_capture():
    assert is_compiling() is False
