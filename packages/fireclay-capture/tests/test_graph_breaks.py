"""Graph breaks: the generated corpus (every breaker in every shape of code) against eager,
outputs and side effects, plus hand-written cases for side effects and the controls."""

from __future__ import annotations

import copy

import pytest
import torch
from breaks_corpus import build_module

from fireclay_capture import capture
from fireclay_ir import verify

MODULE, CASES = build_module()


def inputs():
    return torch.randn(3, 3), torch.randn(3, 3)


def run_against_eager(fn, make_inputs, calls: int = 3):
    compiled = capture(fn)
    for _ in range(calls):
        args = make_inputs()
        MODULE.EVENTS.clear()
        expected = fn(*copy.deepcopy(args))
        eager_events = list(MODULE.EVENTS)
        MODULE.EVENTS.clear()
        actual = compiled(*args)
        assert list(MODULE.EVENTS) == eager_events
        torch.testing.assert_close(actual, expected, rtol=1e-5, atol=1e-5)
    return compiled


@pytest.mark.parametrize("name", sorted(CASES))
def test_break_matches_eager(name):
    run_against_eager(CASES[name], inputs)
    # Graphs (with at least one op) and breaks of one first call, resume functions included.
    compiled = capture(CASES[name])
    MODULE.EVENTS.clear()
    torch.manual_seed(0)  # branches on values: which resume functions run depends on the data
    compiled(*inputs())
    assert (compiled.graph_count(), compiled.break_count()) == EXPECTED_GRAPHS[name]
    for program in _all_programs(compiled):
        verify(program)


def _all_programs(compiled):
    yield from compiled.programs
    for child in compiled.children:
        yield from _all_programs(child)


# (graphs with at least one op, graph breaks) after one call, resume functions and callees
# included. A break inside a try block runs the whole frame eagerly (no graph).
EXPECTED_GRAPHS = {
    **{f"after_no_grad__{b}": v for b, v in {
        "disabled": (2, 1), "global_append": (2, 1), "graph_break": (2, 1), "id_builtin": (2, 1),
        "item": (2, 1), "item_branch": (2, 1), "logging": (1, 0), "numpy": (1, 1), "numpy_call": (2, 2),
        "print": (2, 1), "tensor_branch": (2, 1), "tolist": (2, 1),
    }.items()},
    **{f"for_loop__{b}": v for b, v in {
        "disabled": (4, 3), "global_append": (4, 3), "graph_break": (4, 3), "id_builtin": (4, 3),
        "item": (4, 3), "item_branch": (4, 3), "logging": (1, 0), "numpy": (1, 1), "numpy_call": (4, 6),
        "print": (4, 3), "tensor_branch": (4, 3), "tolist": (4, 3),
    }.items()},
    **{f"for_over_list__{b}": v for b, v in {
        "disabled": (3, 2), "global_append": (3, 2), "graph_break": (3, 2), "id_builtin": (3, 2),
        "item": (3, 2), "item_branch": (3, 2), "logging": (1, 0), "numpy": (1, 1), "numpy_call": (3, 4),
        "print": (3, 2), "tensor_branch": (3, 2), "tolist": (3, 2),
    }.items()},
    **{f"in_inlined_call__{b}": v for b, v in {
        "disabled": (5, 4), "global_append": (5, 4), "graph_break": (5, 4), "id_builtin": (5, 4),
        "item": (5, 4), "item_branch": (5, 4), "logging": (1, 0), "numpy": (3, 4), "numpy_call": (5, 6),
        "print": (5, 4), "tensor_branch": (5, 4), "tolist": (5, 4),
    }.items()},
    **{f"in_try_block__{b}": v for b, v in {
        "disabled": (0, 0), "global_append": (0, 0), "graph_break": (0, 0), "id_builtin": (0, 0),
        "item": (0, 0), "item_branch": (0, 0), "logging": (1, 0), "numpy": (0, 0), "numpy_call": (0, 0),
        "print": (0, 0), "tensor_branch": (0, 0), "tolist": (0, 0),
    }.items()},
    **{f"in_with_block__{b}": v for b, v in {
        "disabled": (2, 1), "global_append": (2, 1), "graph_break": (2, 1), "id_builtin": (2, 1),
        "item": (2, 1), "item_branch": (2, 1), "logging": (1, 0), "numpy": (1, 1), "numpy_call": (1, 1),
        "print": (2, 1), "tensor_branch": (2, 1), "tolist": (2, 1),
    }.items()},
    **{f"kwargs_and_defaults__{b}": v for b, v in {
        "disabled": (5, 4), "global_append": (5, 4), "graph_break": (5, 4), "id_builtin": (5, 4),
        "item": (5, 4), "item_branch": (5, 4), "logging": (1, 0), "numpy": (3, 4), "numpy_call": (5, 6),
        "print": (5, 4), "tensor_branch": (5, 4), "tolist": (5, 4),
    }.items()},
    **{f"nested_three_deep__{b}": v for b, v in {
        "disabled": (8, 4), "global_append": (8, 4), "graph_break": (8, 4), "id_builtin": (8, 4),
        "item": (8, 4), "item_branch": (8, 4), "logging": (1, 0), "numpy": (7, 4), "numpy_call": (8, 5),
        "print": (8, 4), "tensor_branch": (8, 4), "tolist": (8, 4),
    }.items()},
    **{f"result_in_tuple__{b}": v for b, v in {
        "disabled": (2, 1), "global_append": (2, 1), "graph_break": (2, 1), "id_builtin": (2, 1),
        "item": (2, 1), "item_branch": (2, 1), "logging": (1, 0), "numpy": (1, 1), "numpy_call": (2, 2),
        "print": (2, 1), "tensor_branch": (2, 1), "tolist": (2, 1),
    }.items()},
    **{f"straight__{b}": v for b, v in {
        "disabled": (2, 1), "global_append": (2, 1), "graph_break": (2, 1), "id_builtin": (2, 1),
        "item": (2, 1), "item_branch": (2, 1), "logging": (1, 0), "numpy": (1, 1), "numpy_call": (2, 2),
        "print": (2, 1), "tensor_branch": (2, 1), "tolist": (2, 1),
    }.items()},
    **{f"two_breaks__{b}": v for b, v in {
        "disabled": (3, 2), "global_append": (3, 2), "graph_break": (3, 2), "id_builtin": (3, 2),
        "item": (3, 2), "item_branch": (3, 2), "logging": (1, 0), "numpy": (1, 1), "numpy_call": (3, 4),
        "print": (3, 2), "tensor_branch": (3, 2), "tolist": (3, 2),
    }.items()},
    **{f"while_loop__{b}": v for b, v in {
        "disabled": (2, 2), "global_append": (2, 2), "graph_break": (2, 2), "id_builtin": (3, 2),
        "item": (3, 2), "item_branch": (3, 2), "logging": (1, 0), "numpy": (1, 1), "numpy_call": (3, 4),
        "print": (2, 2), "tensor_branch": (2, 2), "tolist": (3, 2),
    }.items()},
}


def test_loop_that_breaks_on_every_iteration_stays_bounded(caplog):
    def fn(x, n):
        for i in range(n):
            x = x * 1.01 + i
            MODULE.graph_break()
        return x

    compiled = capture(fn)
    with caplog.at_level("WARNING", logger="fireclay_capture"):
        for n in (3, 200):
            x = torch.randn(4)
            torch.testing.assert_close(compiled(x, n), fn(x, n))
    assert not [r for r in caplog.records if r.levelname == "WARNING"]


def _continue_a_loop(x, n):
    y = x + 1
    for i in range(n):
        y = y * 2
        print(i)
    return y


@pytest.mark.parametrize("remaining", [0, 1, 3])
def test_resume_function_reenters_a_loop_with_its_iterator(remaining):
    import dis

    from fireclay_capture.resume import ITER_SLOT, VALUE_SLOT, resume_function_for

    insts = list(dis.get_instructions(_continue_a_loop))
    print_call = [i for i in insts if i.opname == "CALL"][-1]
    after = next(i for i in insts if i.offset > print_call.offset)
    resume = resume_function_for(_continue_a_loop, after.offset, (ITER_SLOT, VALUE_SLOT),
                                 ("x", "n", "y", "i"))
    # Stopped after print(i) returned None, with `remaining` iterations left to run.
    items = tuple(range(10, 10 + remaining))
    assert resume(items, None, 0, 99, 5, 7) == 5 * 2 ** remaining
    assert resume.__code__.co_argcount == 6
    assert resume.__name__ == "resume_in__continue_a_loop"


def _no_grad_block_with_break(x, w, fail):
    with torch.no_grad():
        y = x * w
        print("inside", torch.is_grad_enabled())
        if fail:
            raise ValueError("raised inside the resumed block")
        y = y + 1
    return y * x, torch.is_grad_enabled()


@pytest.mark.parametrize("outer_grad", [True, False])
def test_break_inside_no_grad_resumes_in_the_block(outer_grad):
    compiled = capture(_no_grad_block_with_break)
    with torch.set_grad_enabled(outer_grad):
        for _ in range(3):
            x, w = torch.randn(3, requires_grad=True), torch.randn(3)
            (out, mode), (ref, ref_mode) = compiled(x, w, False), _no_grad_block_with_break(x, w, False)
            torch.testing.assert_close(out, ref)
            assert (mode, out.requires_grad) == (ref_mode, ref.requires_grad)
            assert torch.is_grad_enabled() is outer_grad
            with pytest.raises(ValueError, match="resumed block"):
                compiled(x, w, True)
            assert torch.is_grad_enabled() is outer_grad  # the block's exit ran on the way out
    assert compiled.break_count() >= 1 and compiled.stats.fallbacks == 0
