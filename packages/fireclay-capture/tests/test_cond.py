"""cond(): one hop::cond node with two sub-graphs, checked against eager over both branches."""

from __future__ import annotations

import pytest
import torch

from fireclay_capture import capture, cond
from fireclay_ir import dumps, loads, verify


def add_or_sub(x, y):
    z = x * 2
    return cond(z.sum() > 0, lambda a, b: a + b, lambda a, b: a - b.sin(), (z, y)) * 3


def tuple_results(x, y):
    return torch.cond(x.mean() > 0, lambda a: (a.cos(), a + 1), lambda a: (a.sin(), a - 1), (x,))


def nested_functions(x, y):
    def big(a, b):
        return torch.relu(a @ b.T)

    def small(a, b):
        return (a * 0.5) @ b.T

    return cond(y.max() > 0.5, big, small, [x, y]).sum(1)


def constant_predicate(x, y):
    return cond(x.shape[0] > 2, lambda a: a + 1, lambda a: a - 1, (x,))


def pred_from_item_free_math(x, y):
    flag = (x.abs().sum() > y.abs().sum())
    out = cond(flag, lambda a, b: a * b, lambda a, b: a / (b.abs() + 1), (x, y))
    return out + cond(~flag, lambda a: a.exp(), lambda a: a.tanh(), (out,))


CASES = {
    # name: (fn, hop::cond nodes in the graph)
    "add_or_sub": (add_or_sub, 1),
    "tuple_results": (tuple_results, 1),
    "nested_functions": (nested_functions, 1),
    "constant_predicate": (constant_predicate, 0),
    "pred_from_item_free_math": (pred_from_item_free_math, 2),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_cond_is_one_node_and_matches_eager(name):
    fn, n_conds = CASES[name]
    compiled = capture(fn, fullgraph=True)
    for _ in range(6):  # random inputs take both branches
        x, y = torch.randn(4, 3), torch.randn(4, 3)
        torch.testing.assert_close(compiled(x, y), fn(x, y))
    assert compiled.stats.captures == 1
    program = compiled.last_program
    verify(program)
    conds = [n for n in program.graphs[program.entry].nodes if n.op == "hop::cond"]
    assert len(conds) == n_conds
    assert len(program.graphs) == 1 + 2 * n_conds
    assert dumps(loads(dumps(program))) == dumps(program)


def test_cond_branch_reading_an_outer_tensor_is_refused():
    def fn(x, y):
        return cond(x.sum() > 0, lambda a: a + y, lambda a: a - y, (x,))

    with pytest.raises(Exception, match="operands"):
        capture(fn, fullgraph=True)(torch.randn(3), torch.randn(3))
    compiled = capture(fn)  # without fullgraph: split at the cond call, still right
    x, y = torch.randn(3), torch.randn(3)
    torch.testing.assert_close(compiled(x, y), fn(x, y))


def test_cond_branches_of_different_shapes_are_refused():
    def fn(x):
        return cond(x.sum() > 0, lambda a: a.sum(0), lambda a: a, (x,))

    with pytest.raises(Exception, match="different shapes"):
        capture(fn, fullgraph=True)(torch.randn(3, 2))
