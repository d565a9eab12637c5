"""Autocast regions: recorded as enter/exit nodes, dtypes as eager's, guarded on the outer state."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from fireclay_capture import capture


def mixed(x, w):
    with torch.autocast("cpu", dtype=torch.bfloat16):
        y = F.linear(x, w)
        z = torch.relu(y)
    return z, z.float().softmax(-1), (x @ w.T).dtype


def test_autocast_region_matches_eager():
    cf = capture(mixed, fullgraph=True)
    for _ in range(2):
        x, w = torch.randn(3, 8), torch.randn(4, 8)
        out, expected = cf(x, w), mixed(x, w)
        assert out[0].dtype == expected[0].dtype == torch.bfloat16
        torch.testing.assert_close(out[0], expected[0])
        torch.testing.assert_close(out[1], expected[1])
        assert out[2] == expected[2] == torch.float32
    ops = [n.op for n in cf.last_program.main.nodes]
    assert ops[0] == "torch::torch.amp.autocast_enter" and "torch::torch.amp.autocast_exit" in ops
    assert cf.stats.captures == 1
    assert not torch.is_autocast_enabled("cpu")


def plain(x, w):
    return F.linear(x, w)


def test_outer_autocast_state_is_guarded():
    cf = capture(plain, fullgraph=True)
    x, w = torch.randn(3, 8), torch.randn(4, 8)
    assert cf(x, w).dtype == torch.float32
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = cf(x, w)
        expected = plain(x, w)
    assert out.dtype == expected.dtype == torch.bfloat16
    torch.testing.assert_close(out, expected)
    assert cf.stats.captures == 2


def disabled_region(x):
    with torch.autocast("cpu", enabled=False):
        return x * 2


def test_disabled_autocast_region():
    cf = capture(disabled_region, fullgraph=True)
    x = torch.randn(3)
    torch.testing.assert_close(cf(x), x * 2)
