"""explain(): counts against what the capture did, and the report's text against golden files
(paths relative to the package, addresses and times hidden)."""

from __future__ import annotations

import os
import pathlib

import pytest
import torch

from fireclay_capture import explain, graph_break
from fireclay_capture.explain import normalise_report

GOLDEN = pathlib.Path(__file__).parent / "golden"


def one_graph(x):
    return torch.relu(x * 2).sum(0)


def prints_in_the_middle(x):
    y = x.sin()
    print("halfway")
    return y.cos() + 1


def item_then_branch(x):
    y = x.abs() + 1
    if y.max().item() > 100:
        return y * 0
    return y / y.max()


def forced_break(x):
    a = x + 1
    graph_break()
    b = a * 2
    graph_break()
    return b - 1


CASES = {
    # name: (fn, graphs, breaks, ops)
    "one_graph": (one_graph, 1, 0, 3),
    "prints_in_the_middle": (prints_in_the_middle, 2, 1, 3),
    "item_then_branch": (item_then_branch, 2, 1, 5),
    "forced_break": (forced_break, 3, 2, 3),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_explain_counts_and_report(name, monkeypatch):
    fn, graphs, breaks, ops = CASES[name]
    torch.manual_seed(0)  # guards on .item() values are part of the report
    x = torch.randn(4, 3)
    report = explain(fn)(x)
    torch.testing.assert_close(report.result, fn(x))
    assert (report.graph_count, report.break_count, report.op_count) == (graphs, breaks, ops)
    assert len(report.ops_per_graph) == graphs
    for reason in report.break_reasons:
        assert reason.file == __file__ and reason.text and reason.suggestion
    monkeypatch.chdir(pathlib.Path(__file__).parent.parent)
    text = normalise_report(str(report))
    golden = GOLDEN / f"explain_{name}.txt"
    if os.environ.get("FIRECLAY_UPDATE_GOLDEN"):
        golden.write_text(text + "\n")
    assert text + "\n" == golden.read_text()
