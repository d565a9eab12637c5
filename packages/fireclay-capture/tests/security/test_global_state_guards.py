"""Process-wide settings are guarded: after each flip (default dtype, grad mode, autocast on/off
and its dtype, deterministic algorithms, a torch function mode) the captured function is
captured again and matches eager; flipping back is served from the cache."""

from __future__ import annotations

import contextlib

import pytest
import torch
from torch.overrides import TorchFunctionMode

from fireclay_capture import capture
from fireclay_capture.guards import global_state


class CountingMode(TorchFunctionMode):
    """A mode that sees every torch call (and so must see the captured program's too)."""

    def __init__(self):
        super().__init__()
        self.calls = 0

    def __torch_function__(self, func, types, args=(), kwargs=None):
        self.calls += 1
        return func(*args, **(kwargs or {}))


@contextlib.contextmanager
def default_dtype(dtype):
    old = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        yield
    finally:
        torch.set_default_dtype(old)


@contextlib.contextmanager
def deterministic(warn_only=False):
    old, old_warn = torch.are_deterministic_algorithms_enabled(), torch.is_deterministic_algorithms_warn_only_enabled()
    torch.use_deterministic_algorithms(True, warn_only=warn_only)
    try:
        yield
    finally:
        torch.use_deterministic_algorithms(old, warn_only=old_warn)


def adds_ones(t):
    return t + torch.ones(3)


def matmul_then_add(t):
    return t @ torch.ones(3, 3, dtype=t.dtype) + torch.full((3,), 0.5)  # autocast changes the matmul


FLIPS = {
    "default_float64": lambda: default_dtype(torch.float64),
    "default_bfloat16": lambda: default_dtype(torch.bfloat16),
    "no_grad": torch.no_grad,
    "enable_grad": torch.enable_grad,
    "autocast_cpu_bfloat16": lambda: torch.autocast("cpu", dtype=torch.bfloat16),
    "autocast_cpu_float16": lambda: torch.autocast("cpu", dtype=torch.float16),
    "autocast_cpu_off": lambda: torch.autocast("cpu", enabled=False),
    "autocast_cpu_bfloat16_to_float16": lambda: torch.autocast("cpu", dtype=torch.float16),
    "deterministic": deterministic,
    "deterministic_warn_only": lambda: deterministic(warn_only=True),
    "function_mode": CountingMode,
}


def _state_outside(name):
    """A setting that differs from the flip's: grad on for no_grad, off for enable_grad..."""
    if name == "enable_grad":
        return torch.no_grad()
    if name in ("autocast_cpu_off", "autocast_cpu_bfloat16_to_float16"):
        return torch.autocast("cpu", dtype=torch.bfloat16)
    return contextlib.nullcontext()


@pytest.mark.parametrize("fn", [adds_ones, matmul_then_add], ids=lambda f: f.__name__)
@pytest.mark.parametrize("flip", sorted(FLIPS))
def test_each_flip_recaptures_and_matches_eager(flip, fn):
    w = torch.randn(3, requires_grad=True)

    def program(t):
        return fn(t) * w

    with _state_outside(flip):
        cf = capture(program, fullgraph=True)
        t = torch.randn(3, dtype=torch.float32)  # the inputs alone never ask for a recapture
        torch.testing.assert_close(cf(t), program(t))
        before = global_state()
        with FLIPS[flip]() as entered:
            assert global_state() != before
            t = torch.randn(3, dtype=torch.float32)  # the inputs alone never ask for a recapture
            got = cf(t)
            if isinstance(entered, CountingMode):
                seen = entered.calls
            want = program(t)
            if isinstance(entered, CountingMode):
                assert seen > 0  # the mode saw the captured program's calls
        assert got.dtype == want.dtype and got.requires_grad == want.requires_grad
        torch.testing.assert_close(got, want)
        assert cf.stats.captures == 2
        t = torch.randn(3, dtype=torch.float32)  # the inputs alone never ask for a recapture
        torch.testing.assert_close(cf(t), program(t))  # back: the first entry again
        assert cf.stats.captures == 2


def test_the_global_state_guard_is_one_line_per_entry():
    cf = capture(adds_ones, fullgraph=True)
    cf(torch.randn(3))
    (entry,) = cf.cache.entries
    assert entry.guards.source.count("___global_state()") == 1
