"""fireclay-loops' channels-last layouts (``lower(..., channels_last=True)``, what
``FIRECLAY_LOOPS_CHANNELS_LAST=cuda`` turns on for CUDA programs) through fireclay-triton, in
Triton's interpreter: the table of convolution programs against eager, output strides included."""

import os

import pytest
import torch
from conv_programs import PROGRAMS, build, same_strides, tolerance

from fireclay_loops import layout, lower, schedule
from fireclay_triton import compile_program

pytestmark = pytest.mark.skipif(os.environ.get("TRITON_INTERPRET") != "1",
                                reason="runs kernels in Triton's interpreter (no CUDA GPU here)")


@pytest.mark.parametrize("case", PROGRAMS, ids=[c.name for c in PROGRAMS])
def test_channels_last_conv_program_matches_eager(case):
    program, b, make_inputs = build(case, torch.float32, seed=21 + sum(map(ord, case.name)))
    scheduled = schedule(lower(program, channels_last=True))
    assert any(layout.is_channels_last(buf.size, buf.stride) for buf in scheduled.program.buffers.values())
    compiled = compile_program(scheduled)
    inputs = make_inputs()
    for k, (g, w) in enumerate(zip(compiled(*inputs), b.eager(*inputs))):
        torch.testing.assert_close(g, w, **tolerance(torch.float32))
        if k not in case.saved:
            expected = program.main.outputs[k].meta.strides if case.meta_strides_differ else w.stride()
            assert same_strides(g, expected), (k, g.stride(), expected)
