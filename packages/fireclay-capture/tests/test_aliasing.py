"""Two sources reaching one real list/dict/object are one value in the trace, and guarded so."""

from __future__ import annotations

import pytest
import torch

from fireclay_capture import capture

SHARED: list = []


def _is_same(a, b, x):
    return x + 1 if a is b else x - 1


def _is_same_first_item(a, b, x):
    # Reads through both names; the answer depends on whether they are one object.
    return x * len(a) + (10.0 if a is b else 0.0) + len(b)


class _Box:
    def __init__(self, scale):
        self.scale = scale


def _list(): return [1.0, 2.0]
def _dict(): return {"k": 2.0}
def _obj(): return _Box(2.0)


MAKERS = [_list, _dict, _obj]


@pytest.mark.parametrize("make", MAKERS, ids=lambda m: m.__name__.strip("_"))
@pytest.mark.parametrize("same_first", [True, False])
def test_is_between_two_arguments_follows_the_real_objects(make, same_first):
    f = capture(_is_same, fullgraph=True)
    one, other = make(), make()
    calls = [(one, one), (one, other)] if same_first else [(one, other), (one, one)]
    for a, b in calls + calls:
        x = torch.randn(5)
        torch.testing.assert_close(f(a, b, x), _is_same(a, b, x))
    # Aliased and distinct are two traces: each guarded against the other, then cached.
    assert f.stats.captures == 2 and f.stats.cache_hits == 2


def test_list_in_a_global_and_passed_in_is_one_list():
    def uses_global(lst, x):
        return x * 2 if lst is SHARED else x * 3

    f = capture(uses_global, fullgraph=True)
    SHARED[:] = [1, 2]
    for lst in (SHARED, [1, 2], SHARED):
        x = torch.randn(3)
        torch.testing.assert_close(f(lst, x), uses_global(lst, x))
    assert f.stats.captures == 2


def _append_then_read(a, b, x):
    a.append(x.sum())
    return x * len(b)


@pytest.mark.parametrize("aliased", [True, False])
def test_list_mutated_through_one_name_is_seen_through_the_other(aliased):
    f = capture(_append_then_read)
    x = torch.randn(4)
    a1, a2 = [], []
    b1 = a1 if aliased else []
    b2 = a2 if aliased else []
    got = f(a1, b1, x)
    want = _append_then_read(a2, b2, x)
    torch.testing.assert_close(got, want)
    assert len(a1) == len(a2) and len(b1) == len(b2)


def _set_then_read(p, q, x):
    p.scale = p.scale + 1.0
    return x * q.scale


@pytest.mark.parametrize("aliased", [True, False])
def test_attribute_set_through_one_name_is_read_through_the_other(aliased):
    f = capture(_set_then_read, fullgraph=True)
    for _ in range(2):
        p_eager, p_capt = _Box(1.0), _Box(1.0)
        q_eager = p_eager if aliased else _Box(5.0)
        q_capt = p_capt if aliased else _Box(5.0)
        x = torch.randn(3)
        torch.testing.assert_close(f(p_capt, q_capt, x), _set_then_read(p_eager, q_eager, x))
        assert (p_capt.scale, q_capt.scale) == (p_eager.scale, q_eager.scale)


def _dict_pair(d, e, x):
    return x * d["k"] + e["k"] * (2.0 if d is e else 1.0)


def test_distinct_dicts_after_an_aliased_trace_recapture():
    f = capture(_dict_pair, fullgraph=True)
    d = {"k": 2.0}
    x = torch.randn(3)
    torch.testing.assert_close(f(d, d, x), _dict_pair(d, d, x))
    e = {"k": 2.0}
    torch.testing.assert_close(f(d, e, x), _dict_pair(d, e, x))
    assert f.stats.captures == 2
    aliased_entry, distinct_entry = f.cache.entries
    assert aliased_entry.guards({"d": d, "e": e, "x": x}) is None
    assert distinct_entry.guards({"d": d, "e": d, "x": x}) is None
