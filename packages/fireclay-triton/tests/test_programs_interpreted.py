"""Multi-op programs through fireclay-triton in Triton's interpreter, against eager, with fresh
random inputs per seed."""

import os

import pytest
import torch
from programs import PROGRAMS, build_program

from fireclay_triton import Config, compile_program

pytestmark = pytest.mark.skipif(os.environ.get("TRITON_INTERPRET") != "1",
                                reason="runs kernels in Triton's interpreter (no CUDA GPU here)")


@pytest.mark.parametrize("seed,looped", [(0, False), (1, False), (2, True)], ids=["seed0", "seed1", "looped"])
@pytest.mark.parametrize("fn,inputs,atol,rtol", PROGRAMS)
def test_program_matches_eager(fn, inputs, atol, rtol, seed, looped):
    b, program, tensors = build_program(fn, inputs, "cpu", seed=seed)
    compiled = compile_program(program, tensors, cfg=Config(persistent_limit=1) if looped else Config())
    if looped:
        assert all(k.kind != "persistent" for k in compiled.kernels)
    got = compiled(*tensors)
    want = b.eager(*tensors)
    assert len(got) == len(want)
    for g, w in zip(got, want):
        assert g.dtype == w.dtype and g.shape == w.shape
        torch.testing.assert_close(g, w, atol=atol, rtol=rtol)
