"""Library calls over operands in several layouts (fireclay-loops' tests/extern_layout_programs.py:
matmuls, fused attention forward and backward, convolution, over contiguous, transposed and
permuted views and values computed from them) compiled and run against eager, values and output
strides; the wrapper takes every library result as the library returned it (no copy into
another layout)."""

from __future__ import annotations

import pytest

import fireclay_cpp
import fireclay_cpp.runtime

programs = pytest.importorskip("extern_layout_programs", reason="needs fireclay-loops' tests in the checkout")

# a few of each kind (each case is a C++ build)
NAMES = ["mm-x10-w01-computed", "bmm-x021-w021", "addmm-x10", "attention-bshd-computed", "attention-hbsd",
         "attention-backward-bshd-computed", "attention-backward-contiguous", "convolution-nhwc"]
CASES = [c for c in programs.CASES if c.name in NAMES]


@pytest.fixture
def copies(monkeypatch):
    """The library results the compiled wrapper had to copy into another layout."""
    return programs.counted_copies(monkeypatch, fireclay_cpp.runtime)


def test_the_cases_are_there():
    assert len(CASES) == len(NAMES)


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_library_calls_over_layouts_compiled(case, copies):
    programs.check_against_eager(case, lambda b, program, inputs: fireclay_cpp.compile_program(program)(*inputs))
    assert copies == []
