"""Channels-last layouts around 2-D convolutions in compiled C++ (fireclay_loops.layout, on by
default for CPU programs): fireclay-loops' table of convolution programs (forward chains,
strided, grouped, dilated, 1x1 with residual adds, transposed, backward chains) compiled and run
against eager in float32 and float64, with output strides checked; and the planned layouts are
the libraries' own, so the wrapper never copies a library result into another layout."""

from __future__ import annotations

import re

import pytest
import torch
from conv_programs import PROGRAMS, build, is_channels_last, same_strides, tolerance

import fireclay_cpp
import fireclay_cpp.runtime
from fireclay_loops import layout, lower, schedule

DTYPES = [torch.float32, torch.float64]


@pytest.fixture
def copies(monkeypatch):
    """The library results the compiled wrapper had to copy into another layout."""
    from extern_layout_programs import counted_copies

    return counted_copies(monkeypatch, fireclay_cpp.runtime)


@pytest.mark.parametrize("dtype", DTYPES, ids=["float32", "float64"])
@pytest.mark.parametrize("case", PROGRAMS, ids=[c.name for c in PROGRAMS])
def test_conv_program_matches_eager(case, dtype, copies):
    program, b, make_inputs = build(case, dtype, seed=11 + sum(map(ord, case.name)))
    scheduled = schedule(lower(program))  # the default: channels-last for CPU convolutions...
    # ...unless copying the weights would cost more than the activations move
    expected = case.name != "heavy_weights"
    assert any(layout.is_channels_last(buf.size, buf.stride) for buf in scheduled.program.buffers.values()) is expected
    compiled = fireclay_cpp.compile_program(scheduled)
    for _ in range(2):
        inputs = make_inputs()
        got, want = compiled(*inputs), b.eager(*inputs)
        assert len(got) == len(want)
        for k, (g, w) in enumerate(zip(got, want)):
            torch.testing.assert_close(g, w, **tolerance(dtype), equal_nan=True)
            if k in case.saved:
                assert not layout.can_be_channels_last(g.shape) or is_channels_last(g), (k, g.stride())
                continue
            expected = program.main.outputs[k].meta.strides if case.meta_strides_differ else w.stride()
            assert same_strides(g, expected), (k, g.stride(), expected)
    if dtype == torch.float32:
        assert copies == []  # every library call returned the layout the lowering planned


def test_convolutions_call_torchs_own_function():
    """The wrapper calls ``torch.convolution`` (torch's C function for aten::convolution.default)
    rather than the operator overload, whose boxed call costs 2-3 us more per convolution: 0.15 ms
    of a batch-2 MobileNetV3-small's 1.2 ms, which makes 52 of them."""
    case = next(c for c in PROGRAMS if c.name == "conv_bn_relu_pool")
    program, b, make_inputs = build(case, torch.float32, seed=7)
    compiled = fireclay_cpp.compile_program(program)
    assert "op_aten_convolution_default(" in compiled.wrapper_source
    assert fireclay_cpp.runtime.extern_op("aten::convolution.default") is torch.convolution
    assert compiled._call.__globals__["op_aten_convolution_default"] is torch.convolution
    for _ in range(2):
        inputs = make_inputs()
        for g, w in zip(compiled(*inputs), b.eager(*inputs)):
            torch.testing.assert_close(g, w, **tolerance(torch.float32))


def test_first_convolution_reads_a_copy_made_by_a_kernel():
    """The contiguous program input is copied channels-last by a kernel of the program (into the
    arena), then handed to the library as a view (one of the workspace's, made once)."""
    case = next(c for c in PROGRAMS if c.name == "conv_bn_relu_pool")
    program, b, make_inputs = build(case, torch.float32, seed=5)
    compiled = fireclay_cpp.compile_program(program)
    wrapper = compiled.wrapper_source
    first_conv = next(line for line in wrapper.splitlines() if "op_aten_convolution_default(" in line)
    view = first_conv.split("op_aten_convolution_default(", 1)[1].split(",", 1)[0]
    made = next(line for line in wrapper.splitlines() if line.strip().startswith("return (arena, "))
    views = re.findall(r"arena_\w+\.as_strided\(\([^)]*\), \([^)]*\), \d+\)", made)
    assert view.startswith("ws") and views[int(view[2:])].startswith(
        "arena_float32.as_strided((4, 3, 12, 12), (432, 1, 36, 3)")
    inputs = make_inputs()
    for g, w in zip(compiled(*inputs), b.eager(*inputs)):
        torch.testing.assert_close(g, w, **tolerance(torch.float32))


def test_padded_window_loops_read_without_invariant_selects():
    """A padded max pool's windows are in or out row by row: its masks do not change along the
    vectorised (channel) loop. GCC keeps a loop scalar for a ``?:`` on such a mask (a select or a
    masked load); the loop instead loads at an offset that stays inside the buffer where the
    mask is false and blends bits (``fc_blend``), and declares the masks ``int32_t``. The program
    matches eager in the table above (``stem_padded_pool``)."""
    from fireclay_cpp.api import generate_kernels

    case = next(c for c in PROGRAMS if c.name == "stem_padded_pool")
    program, b, make_inputs = build(case, torch.float32, seed=5)
    scheduled = schedule(lower(program))
    pooling = [k for k in scheduled.kernels for kn in k.nodes
               if any("max_pool2d" in o for o in kn.node.meta.get("origins", []))]
    sources = {s.name: s.source for s in generate_kernels(scheduled)}
    assert pooling
    for kernel in pooling:
        source = sources[kernel.name]
        hoisted, loop = source.rsplit("#pragma omp simd", 1)
        assert "fc_blend(" in loop and " ? " not in loop, loop
        assert not re.search(r"\bbool n\d+_t\d+ =", hoisted), hoisted
