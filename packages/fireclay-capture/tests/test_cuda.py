"""Device tracking on a real GPU (skipped without CUDA): fakes keep the real device."""

from __future__ import annotations

import pytest
import torch
import torch.nn as nn

from fireclay_capture import capture

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")


def moves(x):
    y = x.cuda() * 2
    z = torch.zeros(3, device=y.device) + y
    w = z.to("cpu") + 1
    return z, w, y.device, w.is_cuda


@pytest.mark.parametrize("dynamic", [None, True])
def test_device_moves_match_eager(dynamic):
    cf = capture(moves, fullgraph=True, dynamic=dynamic)
    x = torch.randn(3)
    out, expected = cf(x), moves(x)
    for a, e in zip(out[:2], expected[:2]):
        assert a.device == e.device
        torch.testing.assert_close(a, e)
    assert out[2:] == expected[2:]
    devices = {v.meta.device for n in cf.last_program.main.nodes for v in n.outputs if v.is_tensor}
    assert devices == {"cuda:0", "cpu"}


def test_module_on_gpu():
    m = nn.Sequential(nn.Linear(8, 8), nn.GELU(), nn.LayerNorm(8)).cuda().eval()
    cf = capture(m, fullgraph=True)
    x = torch.randn(4, 8, device="cuda")
    torch.testing.assert_close(cf(x), m(x))
    assert cf(x.cpu().cuda()).device.type == "cuda"
    assert cf.stats.captures == 1
