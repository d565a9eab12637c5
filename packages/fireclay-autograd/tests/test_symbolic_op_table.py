"""The op table with symbolic sizes: one trace serves two different input sizes, forward and
gradients against eager at both."""

from __future__ import annotations

import pytest
import torch
from fx_programs import program_from
from helpers import clone_inputs, compare_with_eager
from op_table import CASES
from symbolic import make_dynamic, resized

from fireclay_autograd import compile_program

# Functions that spell a size of their input as a literal (a reshape to (4, 3), a layer norm
# over (4,), a split into 3 parts): other sizes are not valid inputs for them, so they run at
# the traced size only (still traced symbolically).
SAME_SIZE_ONLY = {"view", "split", "unbind", "expand", "ones", "full", "arange", "new_zeros", "layer_norm",
                  "group_norm", "rms_norm", "interpolate_nearest"}
# Cases whose trace turns a size into a float (a mean divides by the element count; symbolic
# floats are specialised) or whose meta kernel decides on a size (negative padding in pad's
# backward): the second size fails the first trace's guards and traces again.
RETRACES = {"mean", "var", "std", "l1_loss", "mse_loss", "bce_with_logits", "smooth_l1", "adaptive_avg_pool2d",
            "batch_norm_eval", "pad"}


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_op_symbolic_two_sizes(case):
    torch.manual_seed(hash(case.name) % 1000 + 7)
    inputs = case.make(torch.float32)
    program = program_from(case.fn, clone_inputs(inputs))
    sizes = make_dynamic(program, inputs)
    if not sizes:
        pytest.skip("no input dim of size >= 2")
    compiled = compile_program(program, clone_inputs(inputs))
    assert compiled.dynamic is not None
    batches = [inputs]
    if case.name not in SAME_SIZE_ONLY:
        batches.append([resized(x, {s: s + 3 for s in sizes}) for x in inputs])
    for batch in batches:
        compare_with_eager(case.fn, compiled, batch, grad=case.grad, atol=1e-4, rtol=1e-4)
        if case.grad:
            compare_with_eager(case.fn, compiled, batch, grad=False, atol=1e-4, rtol=1e-4)
    assert compiled.dynamic.symbolic_failure is None, compiled.dynamic.symbolic_failure
    paths = 2 if case.grad else 1
    if case.name in RETRACES:
        assert compiled.dynamic.traces > paths
    else:
        assert compiled.dynamic.traces == paths
