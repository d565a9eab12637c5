"""Where a channels-last training backward's copies go (fireclay-loops' lowering and scheduler),
compiled and run against eager in float32 and float64 over a table of backward chains:

* a 1 x 1 kernel's weight gradient, written channels-last by the library, is the same memory as
  eager's layout: it is returned as the library wrote it (restrided), never copied by a kernel;
* a k x k kernel's weight gradient is copied into eager's layout right after the convolution
  that made it (while it is in cache), not at the end of the program.
"""

from __future__ import annotations

import pytest
import torch
from conv_programs import same_strides, tolerance
from test_pixel_convolutions import _build

import fireclay_cpp
from fireclay_loops import layout, lower, schedule
from fireclay_loops.ir import ExternNode

CL = torch.channels_last


def conv_chain(kernels: tuple[int, ...], stride: int = 1, batch: int = 4, channels: int = 8, size: int = 10):
    """The backward of a chain of convolutions (kernel sizes ``kernels``, the first of stride
    ``stride``), each weight's gradient a program output, traced in eager's layout (as a
    training step's backward is: the lowering makes it channels-last)."""
    def build(b, g):
        grad = b.input(g(batch, channels, size, size), "grad")
        outs = []
        for k, kernel in enumerate(reversed(kernels)):
            first = k == len(kernels) - 1
            s = stride if first else 1
            x_size = size * s if first else size
            x = b.input(g(batch, channels, x_size, x_size, positive=True), f"x{k}")
            w = b.input(g(channels, channels, kernel, kernel), f"w{k}")
            pad = kernel // 2
            dx, dw, _ = b.call("convolution_backward.default", grad, x, w, [0], [s, s], [pad, pad], [1, 1], False,
                               [0, 0], 1, [True, True, False])
            outs.append(dw)
            grad = dx if first else b.call("threshold_backward.default", dx, x, 1.0)
        return [grad, *outs]
    return build


KERNELS = {"1x1": (1,), "1x1_1x1": (1, 1), "3x3_1x1_3x3": (3, 1, 3), "3x3_3x3_strided": (3, 3), "5x5_1x1": (5, 1)}
CHAINS = {name: conv_chain(k, stride=2 if "strided" in name else 1) for name, k in KERNELS.items()}
DTYPES = [torch.float32, torch.float64]


def _run(build, dtype, seed):
    program, b, make_inputs = _build(build, dtype, seed)
    scheduled = schedule(lower(program))
    compiled = fireclay_cpp.compile_program(scheduled)
    for _ in range(2):
        inputs = make_inputs()
        got, want = compiled(*inputs), b.eager(*inputs)
        for k, (g, w) in enumerate(zip(got, want)):
            scale = max(1.0, w.abs().max().item())  # (sums of a few hundred products)
            torch.testing.assert_close(g, w, rtol=tolerance(dtype)["rtol"], atol=tolerance(dtype)["atol"] * scale)
            assert same_strides(g, w.stride()), (k, g.stride(), w.stride())
    return scheduled


@pytest.mark.parametrize("dtype", DTYPES, ids=["float32", "float64"])
@pytest.mark.parametrize("name", list(CHAINS))
def test_weight_gradients_leave_without_late_copies(name, dtype):
    scheduled = _run(CHAINS[name], dtype, seed=5 + sum(map(ord, name)))
    program, steps = scheduled.program, scheduled.steps
    assert any(layout.is_channels_last(b.size, b.stride) for b in program.buffers.values())
    position = {b: k for k, s in enumerate(steps) for b in s.write_buffers()}
    copied = 0
    for k, step in enumerate(steps):
        if not isinstance(step, ExternNode) or len(step.outputs) < 2:
            continue
        dw = step.outputs[1]
        copies = [s for s in steps if dw in s.read_buffers() and s is not step]
        if all(int(d) == 1 for d in program.buffers[dw].size[2:]):
            assert not copies and dw in program.output_buffers(), f"{dw}: a 1x1 weight gradient copied by a kernel"
            continue
        for copy in copies:  # into eager's layout, before any later library call
            copied += 1
            later = [s.op for s in steps[k + 1:position[copy.write_buffers()[0]]] if isinstance(s, ExternNode)]
            assert not later, (dw, later)
    assert copied == sum(k > 1 for k in KERNELS[name])
