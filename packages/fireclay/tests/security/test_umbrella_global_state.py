"""fireclay.compile through the compiling backend follows process-wide settings: after a flip the
program is compiled again (the settings are baked into the compiled code) and matches eager."""

from __future__ import annotations

import contextlib

import pytest
import torch

import fireclay


@contextlib.contextmanager
def default_dtype(dtype):
    old = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        yield
    finally:
        torch.set_default_dtype(old)


def adds_ones(t):
    return t + torch.ones(3)


FLIPS = {
    "default_float64": lambda: default_dtype(torch.float64),
    "no_grad": torch.no_grad,
}


@pytest.mark.parametrize("flip", sorted(FLIPS))
def test_a_flip_after_compiling_gives_eagers_result(flip, tmp_path):
    w = torch.randn(3, requires_grad=True)

    def program(t):
        return adds_ones(t) * w

    with fireclay.config.shared.patch(cache_dir=str(tmp_path)):
        compiled = fireclay.compile(program)
        t = torch.randn(3, dtype=torch.float32)
        torch.testing.assert_close(compiled(t), program(t))
        with FLIPS[flip]():
            t = torch.randn(3, dtype=torch.float32)
            got, want = compiled(t), program(t)
    assert (got.dtype, got.requires_grad) == (want.dtype, want.requires_grad)
    torch.testing.assert_close(got, want)
