"""The printed loop program, schedule and report are golden-tested: they are what people read.
Set FIRECLAY_UPDATE_GOLDEN=1 to rewrite the golden files after an intended change."""

import os
import pathlib

import pytest
from hand import Hand, t

from fireclay_loops import format_loop_program, lower, schedule

GOLDEN = pathlib.Path(__file__).parent / "golden"


def program():
    h = Hand()
    x, w = h.input("x", 2, 3), h.input("w", 3, 4)
    e = h.op("exp.default", x, out=t(2, 3))
    r = h.op("sum.dim_IntList", e, [1], True, out=t(2, 1))
    m = h.op("mm.default", e, w, out=t(2, 4))
    return h.program(h.op("div.Tensor", m, r, out=t(2, 4)))


def check(name: str, text: str) -> None:
    path = GOLDEN / name
    if os.environ.get("FIRECLAY_UPDATE_GOLDEN"):
        path.write_text(text + "\n")
    assert text + "\n" == path.read_text()


@pytest.mark.parametrize("what", ["loop_program", "schedule", "report"])
def test_golden_text(what):
    lp = lower(program())
    if what == "loop_program":
        check("loop_program.txt", format_loop_program(lp))
    elif what == "schedule":
        check("schedule.txt", str(schedule(lp)))
    else:
        check("report.txt", str(schedule(lp).report()))


def test_index_expressions_print_in_kernel_variables():
    text = str(schedule(lower(program())))
    assert "def kernel0(x0 < 2, r0 < 3):  # reduction" in text
    assert "load(in_x, r0 + 3*x0)" in text
