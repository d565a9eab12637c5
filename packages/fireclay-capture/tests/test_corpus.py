"""Run every corpus case captured and compare with eager on fresh random inputs."""

from __future__ import annotations

import copy

import pytest
import torch
from corpus import Case, all_cases

from fireclay_capture import capture
from fireclay_ir.verifier import verify

CASES = all_cases()


def assert_same(actual, expected, atol: float, path: str = "out") -> None:
    assert type(actual) is type(expected), f"{path}: {type(actual).__name__} != {type(expected).__name__}"
    if isinstance(expected, torch.Tensor):
        assert actual.shape == expected.shape, f"{path}: shape {actual.shape} != {expected.shape}"
        assert actual.dtype == expected.dtype, f"{path}: dtype {actual.dtype} != {expected.dtype}"
        assert actual.requires_grad == expected.requires_grad, f"{path}: requires_grad differs"
        if expected.dtype.is_floating_point:
            torch.testing.assert_close(actual.detach(), expected.detach(), atol=atol, rtol=1e-5,
                                       equal_nan=True, msg=path)
        else:
            assert torch.equal(actual, expected), path
    elif isinstance(expected, (list, tuple)):
        assert len(actual) == len(expected), f"{path}: length {len(actual)} != {len(expected)}"
        for i, (a, e) in enumerate(zip(actual, expected)):
            assert_same(a, e, atol, f"{path}[{i}]")
    elif isinstance(expected, dict):
        assert list(actual) == list(expected), f"{path}: keys {list(actual)} != {list(expected)}"
        for k in expected:
            assert_same(actual[k], expected[k], atol, f"{path}[{k!r}]")
    elif hasattr(expected, "__dict__") and not isinstance(expected, type):
        assert_same(vars(actual), vars(expected), atol, path)
    else:
        assert actual == expected, f"{path}: {actual!r} != {expected!r}"


def run_case(case: Case) -> None:
    compiled = capture(case.fn, fullgraph=case.fallbacks == 0 and case.breaks == 0)
    for i in range(case.calls):
        args = case.inputs_for_call(i) if case.inputs_for_call else case.inputs()
        kwargs = case.kwargs()
        eager_args = copy.deepcopy(args)
        expected = case.fn(*eager_args, **copy.deepcopy(kwargs))
        actual = compiled(*args, **kwargs)
        assert_same(actual, expected, case.atol)
        assert_same(list(args), list(eager_args), case.atol, "inputs after the call")
    stats = compiled.stats
    assert (stats.captures, stats.recompiles, stats.fallbacks) == (case.graphs, case.recompiles, case.fallbacks), stats
    assert sum(e.graph_break is not None for e in compiled.cache.entries) == case.breaks
    for program in compiled.programs:
        verify(program)
        for node in program.main.nodes:
            assert node.meta.get("source", {}).get("line"), f"{node} has no source location"


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_corpus_case(case: Case) -> None:
    run_case(case)


def test_corpus_size() -> None:
    assert len(CASES) >= 300


# Under dynamic=True these break or fall back to eager (results still checked): ops whose symbolic
# meta kernels fireclay-shapes does not run yet.
DYNAMIC_FALLBACKS = {"tensor_ops.cross_entropy", "tensor_ops.linalg_ops", "python.integer_ops_on_sizes"}
if tuple(int(part) for part in torch.__version__.split(".")[:2]) < (2, 14):
    DYNAMIC_FALLBACKS.add("op_table.shape_interpolate")  # torch 2.14's upsampling meta kernels take symbolic sizes
DYNAMIC_CASES = [c for c in CASES if not c.fallbacks and not c.breaks and not c.inputs_for_call]


@pytest.mark.parametrize("case", DYNAMIC_CASES, ids=[c.name for c in DYNAMIC_CASES])
def test_corpus_case_dynamic(case: Case) -> None:
    """Every case traced with symbolic sizes still matches eager."""
    compiled = capture(case.fn, dynamic=True, fullgraph=case.name not in DYNAMIC_FALLBACKS)
    for _ in range(2):
        args = case.inputs()
        kwargs = case.kwargs()
        eager_args = copy.deepcopy(args)
        expected = case.fn(*eager_args, **copy.deepcopy(kwargs))
        assert_same(compiled(*args, **kwargs), expected, case.atol)
        assert_same(list(args), list(eager_args), case.atol, "inputs after the call")
    if case.name in DYNAMIC_FALLBACKS:  # split at the op (a graph break) or run eagerly
        assert compiled.stats.fallbacks + compiled.break_count() >= 1
    else:
        assert (compiled.stats.fallbacks, compiled.break_count()) == (0, 0)
