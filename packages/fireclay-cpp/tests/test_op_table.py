"""fireclay-loops' op table through the C++ backend, against eager, on fresh random inputs.

The cases are read from fireclay-loops' own table (its tests folder in the checkout), then run
again with their float32 inputs turned float64 and bfloat16. All cases of one sweep compile as
one program (one library), and each case checks its own outputs.
"""

from __future__ import annotations

import importlib.util
import os

import pytest
import torch
from conftest import LOOPS_TESTS

TABLE = os.path.join(LOOPS_TESTS, "test_op_table.py")
if not os.path.exists(TABLE):
    pytest.skip("fireclay-loops' op table is not in this checkout", allow_module_level=True)

from batch import Case, build_batch, check_case, retype  # noqa: E402

import fireclay_cpp  # noqa: E402


def _load_table() -> list[Case]:
    spec = importlib.util.spec_from_file_location("fireclay_loops_op_table", TABLE)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    cases = []
    for p in module.CASES:
        op, args, kwargs, atol, rtol, first_only = p.values
        cases.append(Case(p.id, op, args, kwargs, atol, rtol, first_only))
    return cases


BASE = _load_table()
# Data movement, extern calls and fallbacks do not depend on the dtype beyond what the table
# covers: the other sweeps take the arithmetic and reduction cases only, to keep compile time down.
MOVEMENT = {"view", "reshape", "permute", "transpose", "t", "expand", "slice", "select", "squeeze", "unsqueeze",
            "as_strided", "diagonal", "flip", "repeat", "split", "unbind", "narrow", "alias", "gather",
            "index_select", "embedding", "index", "cat", "stack", "constant_pad_nd", "full", "zeros", "ones",
            "zeros_like", "ones_like", "full_like", "arange", "scalar_tensor", "mm", "bmm", "addmm", "baddbmm",
            "convolution", "_scaled_dot_product_flash_attention_for_cpu", "cumsum", "sort", "topk", "scatter",
            "index_put", "_unsafe_index_put", "index_add", "scatter_add", "embedding_dense_backward", "clone"}


def _sweep(name: str) -> list[Case]:
    if name == "table":
        return BASE
    arithmetic = [c for c in BASE if c.op.split(".")[0] not in MOVEMENT]
    if name == "float64":
        return [retype(c, torch.float64) for c in arithmetic]
    cases = [retype(c, torch.bfloat16) for c in arithmetic]
    for c in cases:
        c.atol, c.rtol = max(c.atol, 3e-2), max(c.rtol, 2e-2)
        # eager keeps the saved mean and rstd of layer and batch norm in bfloat16, the meta
        # kernels (and so the program) say float32
        c.first_only = c.first_only or "layer_norm" in c.op or "batch_norm" in c.op
    return cases


SWEEPS = {name: _sweep(name) for name in ("table", "float64", "bfloat16")}


@pytest.fixture(scope="module")
def results():
    """sweep -> (batch, compiled outputs, eager outputs), compiled once per sweep."""
    done = {}

    def get(sweep: str):
        if sweep not in done:
            batch = build_batch(SWEEPS[sweep])
            program = batch.builder.output(*batch.handles)
            compiled = fireclay_cpp.compile_program(program, batch.tensors)
            got = compiled(*batch.tensors)
            want = batch.builder.eager(*batch.tensors)
            done[sweep] = (batch, got, want)
        return done[sweep]

    return get


PARAMS = [pytest.param(sweep, c, id=f"{sweep}-{c.id}") for sweep, cases in SWEEPS.items() for c in cases]


@pytest.mark.parametrize("sweep,case", PARAMS)
def test_op_matches_eager(results, sweep, case):
    batch, got, want = results(sweep)
    check_case(case, batch, got, want)
