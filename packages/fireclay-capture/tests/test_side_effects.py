"""Side effects around graph breaks: mutation of the caller's lists and dicts, globals and
attributes (replayed after the graph, see test_side_effect_replay.py) next to code that breaks
the graph, checked against eager, state included."""

from __future__ import annotations

import copy
import logging

import pytest
import torch

from fireclay_capture import CaptureError, capture

COUNTER = 0
LAST = None


def append_to_input_list(x, log):
    y = x.sin()
    log.append(y.sum())
    return y * len(log)


def extend_and_pop_input_list(x, log):
    y = x + 1
    log.extend([y.mean(), 3])
    first = log.pop(0)
    return y * first


def setitem_on_input_dict(x, d):
    y = x.cos()
    d["seen"] = y.clone()
    return y + d["bias"]


def update_input_dict(x, d):
    y = x * 2
    d.update(total=y.sum(), count=2)
    return y - d["bias"]


def delete_from_input_dict(x, d):
    y = x.relu()
    del d["bias"]
    return y + len(d)


def write_global_counter(x, _):
    global COUNTER
    y = x.exp()
    COUNTER = COUNTER + 1
    return y * 2


def write_global_tensor(x, _):
    global LAST
    y = x.tanh()
    LAST = y
    return y + 1


class Box:
    def __init__(self):
        self.hits = 0
        self.value = None


def attribute_write_then_break(x, box):
    box.hits = box.hits + 1
    y = x * 3
    print("box now", box.hits)
    box.value = y
    return y.sum()


class Counting(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(4, 4)
        self.calls = 0

    def forward(self, x):
        self.calls += 1
        y = self.lin(x)
        print("forward", self.calls)
        return torch.relu(y)


def _list_inputs():
    return torch.randn(3, 4), [torch.randn(())]


def _dict_inputs():
    return torch.randn(3, 4), {"bias": torch.randn(4)}


def _box_inputs():
    return torch.randn(3, 4), Box()


CASES = {
    "append_to_input_list": (append_to_input_list, _list_inputs),
    "extend_and_pop_input_list": (extend_and_pop_input_list, _list_inputs),
    "setitem_on_input_dict": (setitem_on_input_dict, _dict_inputs),
    "update_input_dict": (update_input_dict, _dict_inputs),
    "delete_from_input_dict": (delete_from_input_dict, _dict_inputs),
    "write_global_tensor": (write_global_tensor, _dict_inputs),
    "attribute_write_then_break": (attribute_write_then_break, _box_inputs),
}


def same(a, b):
    if isinstance(a, torch.Tensor):
        torch.testing.assert_close(a, b)
    elif isinstance(a, (list, tuple)):
        assert len(a) == len(b)
        for p, q in zip(a, b):
            same(p, q)
    elif isinstance(a, dict):
        assert list(a) == list(b)
        for k in a:
            same(a[k], b[k])
    elif isinstance(a, Box):
        same(vars(a), vars(b))
    else:
        assert a == b


@pytest.mark.parametrize("name", sorted(CASES))
def test_side_effects_match_eager(name):
    fn, make = CASES[name]
    compiled = capture(fn)
    for _ in range(3):
        args = make()
        eager_args = copy.deepcopy(args)
        expected = fn(*eager_args)
        eager_last = LAST
        actual = compiled(*args)
        same(actual, expected)
        same(list(args), list(eager_args))
        if name == "write_global_tensor":
            same(LAST, eager_last)
    # The changes are replayed after one graph; only the print breaks it.
    assert compiled.break_count() == (name == "attribute_write_then_break") and compiled.stats.fallbacks == 0


def test_global_counter_counts_every_call():
    global COUNTER
    compiled = capture(write_global_counter)
    COUNTER = 0
    for i in range(4):
        x = torch.randn(3)
        torch.testing.assert_close(compiled(x, None), x.exp() * 2)
        assert COUNTER == i + 1
    # The trace reads COUNTER as a constant (guarded), so each new value is a new capture; the
    # write is replayed after the graph.
    assert compiled.stats.captures == 4 and compiled.break_count() == 0


def test_module_attribute_and_print_inside_forward(capsys):
    m = Counting()
    compiled = capture(m)
    x = torch.randn(2, 4)
    for i in range(3):
        torch.testing.assert_close(compiled(x), torch.relu(m.lin(x)))
        assert m.calls == i + 1
    assert capsys.readouterr().out.splitlines() == ["forward 1", "forward 2", "forward 3"]


def test_fullgraph_still_refuses_a_break():
    with pytest.raises(CaptureError, match="print"):
        capture(attribute_write_then_break, fullgraph=True)(*_box_inputs())


def test_internal_error_runs_the_frame_eagerly_and_logs_it(monkeypatch, caplog):
    from fireclay_capture.interpreter import frame as frame_module

    def broken(frame, inst):
        raise RuntimeError("a bug in a handler")

    monkeypatch.setitem(frame_module.HANDLERS, "BINARY_OP", broken)

    def fn(x):
        return x * 2 + 1

    compiled = capture(fn)
    x = torch.randn(3)
    with caplog.at_level(logging.WARNING, logger="fireclay_capture"):
        torch.testing.assert_close(compiled(x), x * 2 + 1)
        torch.testing.assert_close(compiled(x), x * 2 + 1)
    assert compiled.stats.fallbacks == 1
    assert sum("a bug in a handler" in r.getMessage() for r in caplog.records) == 1


def test_internal_error_reaches_the_user_under_fullgraph(monkeypatch):
    from fireclay_capture.interpreter import frame as frame_module

    def broken(frame, inst):
        raise RuntimeError("a bug in a handler")

    monkeypatch.setitem(frame_module.HANDLERS, "BINARY_OP", broken)
    with pytest.raises(RuntimeError, match="a bug in a handler"):
        capture(lambda x: x * 2, fullgraph=True)(torch.randn(3))


def _helper_that_appends_then_prints(items, x):
    items.append(x * 2)
    print("appended", len(items))
    return x + 1


def callee_mutates_callers_list_then_breaks(x, _):
    items = [x.sin()]
    y = _helper_that_appends_then_prints(items, x)
    return y, items


def test_callee_mutating_callers_list_before_its_break_is_not_replayed_twice():
    compiled = capture(callee_mutates_callers_list_then_breaks)
    for _ in range(3):
        x = torch.randn(3)
        same(compiled(x, None), callee_mutates_callers_list_then_breaks(x, None))


def nested_containers_across_a_break(x, _):
    log = []
    state = {"log": log, "pair": (log, [x.cos()])}
    print("break")
    log.append(x.sin())
    state["pair"][1].append(x + 1)
    return state  # log's append shows in state["log"] and state["pair"][0] only if they are one list


def test_nested_containers_keep_their_identity_across_a_break():
    compiled = capture(nested_containers_across_a_break)
    for _ in range(3):
        x = torch.randn(3)
        same(compiled(x, None), nested_containers_across_a_break(x, None))
