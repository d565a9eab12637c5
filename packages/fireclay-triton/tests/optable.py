"""Run one case of fireclay-loops' op table through fireclay-triton and compare with eager."""

from __future__ import annotations

import torch
from aten_builder import AtenBuilder, T  # fireclay-loops' test helper (see conftest)

from fireclay_triton import compile_program


def build(op, args, kwargs, device: str, dtype: torch.dtype | None = None, seed: int = 0):
    """The aten program of one op over fresh random inputs (floating inputs cast to ``dtype``)."""
    gen = torch.Generator().manual_seed(seed)
    b = AtenBuilder()
    tensors = []

    def bind(a):
        if isinstance(a, T):
            t = a.make(gen)
            if dtype is not None and t.dtype == torch.float32:
                t = t.to(dtype)
            t = t.to(device)
            tensors.append(t)
            return b.input(t, f"x{len(tensors)}")
        if isinstance(a, list):
            return [bind(x) for x in a]
        return a

    bound = [bind(a) for a in args]
    out = b.call(op, *bound, **kwargs)
    outs = out if isinstance(out, tuple) else (out,)
    return b, b.output(*outs), tensors


def check_case(op, args, kwargs, atol, rtol, first_only, device: str = "cpu", dtype: torch.dtype | None = None,
               seed: int = 0, cfg=None):
    b, program, tensors = build(op, args, kwargs, device, dtype, seed)
    compiled = compile_program(program, tensors, cfg=cfg)
    got = compiled(*tensors)
    want = b.eager(*tensors)
    assert len(got) == len(want)
    for g, w in list(zip(got, want))[: 1 if first_only else None]:
        assert g.dtype == w.dtype, f"{op}: dtype {g.dtype} != eager {w.dtype}"
        assert g.shape == w.shape, f"{op}: shape {tuple(g.shape)} != eager {tuple(w.shape)}"
        torch.testing.assert_close(g, w, atol=atol, rtol=rtol, equal_nan=True)
    return compiled
