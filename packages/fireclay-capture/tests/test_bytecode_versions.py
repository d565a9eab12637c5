"""The version facts in bytecode_versions agree with the bytecode this interpreter compiles."""

import dis

import pytest

from fireclay_capture import bytecode_versions as versions


def _ops(fn) -> list[str]:
    return [i.opname for i in dis.get_instructions(fn)]


def _closure_maker(x):
    def inner():
        return x

    return inner


def _global_call(x):
    return len(x)


def _loop(xs):
    total = 0
    for v in xs:
        total += v
    return total


def test_running_version_is_supported():
    assert versions.PY in versions.SUPPORTED


def test_cell_load_for_closures():
    ops = _ops(_closure_maker)
    assert versions.LOAD_CELL_OPNAME in ops
    assert ("LOAD_CLOSURE" in ops) != versions.LOAD_FAST_LOADS_CELLS


def test_precall_and_directional_jumps():
    assert ("PRECALL" in _ops(_global_call)) == versions.HAS_PRECALL
    import opcode

    assert ("POP_JUMP_FORWARD_IF_TRUE" in opcode.opmap) == versions.DIRECTIONAL_JUMPS


@pytest.mark.parametrize("fact", ["BRANCH_NEEDS_TO_BOOL"])
def test_to_bool_exists_where_branches_need_it(fact):
    import opcode

    assert ("TO_BOOL" in opcode.opmap) == getattr(versions, fact)


def test_end_for_follows_for_iter_where_it_pops():
    ops = _ops(_loop)
    assert ("END_FOR" in ops) == (versions.FOR_ITER_EXHAUSTED != "pop")


def test_captured_closure_and_call_match_eager():
    import torch

    from fireclay_capture import capture

    def fn(x):
        scale = x.sum()

        def add(t):
            return t + scale

        return add(x) * len(x)

    x = torch.randn(4)
    torch.testing.assert_close(capture(fn, fullgraph=True)(x), fn(x))
