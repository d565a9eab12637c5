"""fireclay-loops' op table through fireclay-triton in Triton's interpreter (CPU tensors), against
eager: every case with persistent reductions, and the reduction cases again as looped ones."""

import os

import pytest

torch = pytest.importorskip("torch")
test_op_table = pytest.importorskip("test_op_table", reason="fireclay-loops' tests hold the op table")

from optable import check_case  # noqa: E402

from fireclay_triton import CodegenError, Config  # noqa: E402

pytestmark = pytest.mark.skipif(os.environ.get("TRITON_INTERPRET") != "1",
                                reason="runs kernels in Triton's interpreter (no CUDA GPU here)")

CASES = test_op_table.CASES
LIBDEVICE_ONLY = {"lgamma.default"}  # no composition from tl builtins: GPU only
REDUCING = ("sum", "mean", "prod", "amax", "amin", "max", "min", "arg", "any", "all", "var", "std", "softmax",
            "log_softmax", "logsumexp", "layer_norm", "batch_norm")
REDUCTION_CASES = [c for c in CASES if any(c.id.lstrip("_").startswith(r) for r in REDUCING)]


@pytest.mark.parametrize("op,args,kwargs,atol,rtol,first_only", CASES)
def test_op_matches_eager(op, args, kwargs, atol, rtol, first_only, request):
    if request.node.callspec.id in LIBDEVICE_ONLY:
        with pytest.raises(CodegenError, match="needs CUDA's libdevice"):
            check_case(op, args, kwargs, atol, rtol, first_only)
        return
    check_case(op, args, kwargs, atol, rtol, first_only)


def test_reduction_cases_are_found():
    assert len(REDUCTION_CASES) > 40


@pytest.mark.parametrize("op,args,kwargs,atol,rtol,first_only", REDUCTION_CASES)
def test_looped_reduction_matches_eager(op, args, kwargs, atol, rtol, first_only):
    compiled = check_case(op, args, kwargs, atol, rtol, first_only, cfg=Config(persistent_limit=1))
    assert all(k.kind != "persistent" for k in compiled.kernels)
