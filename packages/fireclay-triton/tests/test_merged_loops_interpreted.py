"""Kernels whose adjacent loops fireclay-loops merged (fireclay_loops.merge_loops): the table of
fireclay-loops' tests/merge_programs.py run in Triton's interpreter against eager, and the text
generated for BERT-sized GELU and LayerNorm kernels (no integer division left for merged loops)."""

from __future__ import annotations

import os

import pytest
import torch
from aten_builder import AtenBuilder
from merge_programs import (
    PARAMS,
    SYMBOLIC_PARAMS,
    assert_results_match,
    assert_symbolic_matches,
    build,
    build_symbolic,
    schedule_with,
    space,
)

from fireclay_triton import compile_program, generate_kernels

interpreted = pytest.mark.skipif(os.environ.get("TRITON_INTERPRET") != "1",
                                 reason="runs kernels in Triton's interpreter (no CUDA GPU here)")




@interpreted
@pytest.mark.parametrize("case", PARAMS)
def test_merged_kernels_match_eager(case):
    b, program, tensors = build(case, seed=2)
    scheduled = schedule_with(program, True)
    assert [space(k) for k in scheduled.kernels] == case.spaces
    got = compile_program(scheduled, tensors)(*tensors)
    # random numbers are drawn per flat element: the unmerged kernels must draw the same ones
    want = compile_program(schedule_with(program, False), tensors)(*tensors) if case.random else b.eager(*tensors)
    assert_results_match(case, got, want)


@interpreted
@pytest.mark.parametrize("case", SYMBOLIC_PARAMS)
def test_merged_symbolic_kernels_match_eager(case):
    scheduled = schedule_with(build_symbolic(case), True)
    assert [space(k) for k in scheduled.kernels] == case.spaces
    assert_symbolic_matches(compile_program(scheduled), case, seed=2)


def _bert_gelu():
    b = AtenBuilder()
    x = b.input(torch.empty(8, 512, 3072, device="meta"), "x")
    return b.output(b.call("gelu.default", x))


def _bert_layer_norm():
    b = AtenBuilder()
    x, r = (b.input(torch.empty(8, 512, 768, device="meta"), n) for n in ("x", "r"))
    w, bias = (b.input(torch.empty(768, device="meta"), n) for n in ("w", "b"))
    out, _, _ = b.call("native_layer_norm.default", b.call("add.Tensor", x, r), [768], w, bias, 1e-12)
    return b.output(out)


@pytest.mark.parametrize("build_program,spaces", [(_bert_gelu, ["[12582912]"]), (_bert_layer_norm, ["[4096] x r[768]"])],
                         ids=["gelu", "layer_norm"])
def test_bert_kernels_index_their_merged_loop_directly(build_program, spaces):
    program = build_program()
    merged = schedule_with(program, True)
    assert [space(k) for k in merged.kernels] == spaces
    text = "\n".join(k.source for k in generate_kernels(merged, interpret=False))
    kept = "\n".join(k.source for k in generate_kernels(schedule_with(program, False), interpret=False))
    assert "x0 = xindex\n" in text and "//" not in text and "%" not in text
    assert "x1" not in text
    assert "xindex // (" in kept  # without merging, the loops are digits of the flat index
