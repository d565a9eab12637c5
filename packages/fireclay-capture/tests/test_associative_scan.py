"""torch's prototype associative_scan traced as plain tensor ops: one graph, eager's values."""

from __future__ import annotations

import pytest
import torch

from fireclay_capture import capture

associative_scan = pytest.importorskip("torch._higher_order_ops.associative_scan").associative_scan


def cumulative_sum(x, y):
    return associative_scan(lambda a, b: a + b, x, dim=0, combine_mode="generic")


def linear_recurrence(x, y):
    # Mamba's selective scan: state_t = a_t * state_{t-1} + b_t, the pair combined associatively.
    def combine(left, right):
        return left[0] * right[0], right[0] * left[1] + right[1]

    _, states = associative_scan(combine, (x.sigmoid(), y), dim=1, combine_mode="generic")
    return states * 2


def reversed_max_on_a_negative_dim(x, y):
    return associative_scan(torch.maximum, x * y, dim=-1, reverse=True, combine_mode="generic")


def matrix_products(x, y):
    # Not pointwise: each element is a 3x3 matrix; "generic" mode calls the combine per element.
    mats = torch.stack([x, y, x * y], dim=-1)  # (rows, 3 steps, 3) -> matrices below
    mats = mats.reshape(-1, 3, 3)[:, None].expand(-1, 3, 3, 3).contiguous() + torch.eye(3)
    return associative_scan(lambda a, b: a @ b, mats, dim=1, combine_mode="generic")


def list_of_leaves(x, y):
    out = associative_scan(lambda a, b: [a[0] + b[0], a[1] * b[1]], [x, y.tanh()], dim=0, combine_mode="generic")
    return out[0] - out[1]


CASES = [cumulative_sum, linear_recurrence, reversed_max_on_a_negative_dim, matrix_products, list_of_leaves]


@pytest.mark.parametrize("fn", CASES, ids=[f.__name__ for f in CASES])
def test_associative_scan_is_one_graph_and_matches_eager(fn):
    compiled = capture(fn, fullgraph=True)
    for _ in range(3):
        x, y = torch.randn(4, 3), torch.randn(4, 3)
        torch.testing.assert_close(compiled(x, y), fn(x, y))
    assert compiled.stats.captures == 1 and compiled.stats.fallbacks == 0


def test_associative_scan_gradients_match_eager():
    x = torch.randn(2, 5, requires_grad=True)
    y = torch.randn(2, 5, requires_grad=True)
    compiled = capture(linear_recurrence, fullgraph=True)
    (compiled(x, y) ** 2).sum().backward()
    got = x.grad.clone(), y.grad.clone()
    x.grad = y.grad = None
    (linear_recurrence(x, y) ** 2).sum().backward()
    torch.testing.assert_close(got, (x.grad, y.grad))
