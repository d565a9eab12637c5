"""Training steps through autograd → loops → Triton kernels, run in Triton's interpreter on CPU.

The GPU path's kernels (batch-norm and layer-norm backward: several reductions in one kernel,
constants shared between them) are generated and run here without a GPU. Each case runs in a
fresh process, because the interpreter switch must be set before triton is first imported.
"""

import json
import os
import subprocess
import sys

import pytest

SCRIPT = r"""
import copy, json, sys
import torch
import fireclay
from fireclay_autograd import aot_backend
from fireclay_triton import triton_backend

name = sys.argv[1]
torch.manual_seed(0)
if name == "conv_bn":
    model = torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3), torch.nn.BatchNorm2d(8), torch.nn.ReLU())
    make = lambda: torch.randn(2, 3, 8, 8)
elif name == "layer_norm_mlp":
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.LayerNorm(32), torch.nn.GELU(), torch.nn.Linear(32, 4))
    make = lambda: torch.randn(6, 16)
else:
    model = torch.nn.Sequential(torch.nn.Linear(12, 24), torch.nn.BatchNorm1d(24), torch.nn.Tanh())
    make = lambda: torch.randn(5, 12)
reference = copy.deepcopy(model)
compiled = fireclay.compile(model, backend=aot_backend(triton_backend, triton_backend), fullgraph=True)
worst = 0.0
for step in range(2):
    x = make()
    got, want = compiled(x), reference(x)
    seed = torch.randn_like(want)
    (got * seed).sum().backward()
    (want * seed).sum().backward()
    pairs = [(got, want)] + [(p.grad, q.grad) for p, q in zip(model.parameters(), reference.parameters())]
    pairs += list(zip(model.buffers(), reference.buffers()))
    for a, b in pairs:
        a, b = a.double(), b.double()
        # relative to the larger of the tensor's scale and 0.01: the bias of a layer before batch
        # norm has a gradient of rounding noise only
        worst = max(worst, ((a - b).abs().max() / b.abs().max().clamp_min(1e-2)).item())
print(json.dumps({"worst": worst}))
"""


@pytest.mark.parametrize("name", ["conv_bn", "layer_norm_mlp", "linear_bn1d"])
def test_training_steps_through_interpreted_triton_match_eager(name, tmp_path):
    env = dict(os.environ, TRITON_INTERPRET="1", FIRECLAY_CACHE_DIR=str(tmp_path))
    done = subprocess.run([sys.executable, "-c", SCRIPT, name], env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    worst = json.loads(done.stdout.strip().splitlines()[-1])["worst"]
    assert worst < 1e-3, f"{name}: relative error {worst:.2e} against eager"
