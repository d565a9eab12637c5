"""Every op of the table, forward and gradients, against eager (float32), plus float64
gradcheck of the compiled callable for the smooth ones."""

from __future__ import annotations

import pytest
import torch
from fx_programs import program_from
from helpers import check_against_eager, clone_inputs
from op_table import CASES

from fireclay_autograd import compile_program

IDS = [c.name for c in CASES]


def test_table_is_large_and_names_unique():
    assert len(CASES) >= 150
    assert len(set(IDS)) == len(IDS)


@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_op_float32(case):
    torch.manual_seed(hash(case.name) % 1000)
    check_against_eager(case.fn, case.make(torch.float32), grad=case.grad, atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_op_inference_path(case):
    torch.manual_seed(hash(case.name) % 1000 + 1)
    check_against_eager(case.fn, case.make(torch.float32), grad=False, atol=1e-4, rtol=1e-4)


GRADCHECK = [c for c in CASES if c.grad and c.gradcheck]


@pytest.mark.parametrize("case", GRADCHECK, ids=[c.name for c in GRADCHECK])
def test_op_gradcheck_float64(case):
    torch.manual_seed(hash(case.name) % 1000 + 2)
    inputs = case.make(torch.float64)
    compiled = compile_program(program_from(case.fn, clone_inputs(inputs)), clone_inputs(inputs))
    diff = [x for x in inputs if isinstance(x, torch.Tensor) and x.requires_grad]
    positions = [i for i, x in enumerate(inputs) if isinstance(x, torch.Tensor) and x.requires_grad]

    def fn(*leaves):
        full = list(inputs)
        for p, leaf in zip(positions, leaves):
            full[p] = leaf
        outs = compiled(*full)
        return tuple(o for o in outs if isinstance(o, torch.Tensor) and o.requires_grad)

    assert torch.autograd.gradcheck(fn, tuple(diff), eps=1e-6, atol=1e-5, rtol=1e-4, fast_mode=True)


@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_op_through_fireclay_ir_interpreter(case):
    """The forward and backward Programs run on fireclay-ir's reference interpreter too."""
    from fireclay_autograd import ir_interpreter_backend

    torch.manual_seed(hash(case.name) % 1000 + 3)
    check_against_eager(case.fn, case.make(torch.float32), grad=case.grad, atol=1e-4, rtol=1e-4,
                        fw_compiler=ir_interpreter_backend)
