"""``torch.device(...)`` built inside captured code, as transformers builds them in forward
(``torch.device("cuda", 0)``, ``torch.device(x.device.type, index)``, ``torch.device(device)``):
from constants it is a constant of the trace, used as a key, compared, printed and passed to
factories within one graph; from data it breaks the graph there; an invalid one raises in the
traced code as eagerly."""

from __future__ import annotations

import pytest
import torch
import torch.utils._pytree as pytree

from fireclay_capture import CaptureError, capture, explain

_GPU = torch.device("cuda", 0)  # made without CUDA as eagerly: only using it needs a GPU


def _to_a_device_by_name(x):
    d = torch.device("cpu")
    return x.to(d) + 1, str(torch.device("cuda", 0))


def _from_the_input_device(x):
    # transformers' masking utils: torch.device(x.device.type, index)
    d = torch.device(x.device.type, x.device.index)
    e = torch.device(d)
    return torch.zeros(2, device=e) + x.sum(), e == x.device, e.type, e.index


def _by_keywords(x):
    d = torch.device(type="cuda", index=1)
    return x + d.index, repr(d), f"{d}", d.type, hash(d) == hash(torch.device("cuda:1")), isinstance(d, torch.device)


def _as_dict_keys(x):
    scales = {torch.device("cpu"): 2.0, torch.device("cuda", 0): 3.0}
    return x * scales[x.device] * scales[torch.device("cuda:0")], torch.device("cpu") in scales


def _compared(x):
    same = torch.device("cuda") == torch.device("cuda", 0), torch.device("cuda:0") == _GPU, _GPU != x.device
    return torch.ones(3, device=torch.device(x.device)) * x, same


def _returned(x):
    return {torch.device("cpu"): x + 1}, torch.device("meta")


def _assert_same(result, expected):
    # tensors by value, devices, strings and flags by ==, dict keys (devices) and nesting by the tree
    leaves, tree = pytree.tree_flatten(result)
    expected_leaves, expected_tree = pytree.tree_flatten(expected)
    assert tree == expected_tree and len(leaves) == len(expected_leaves)
    for a, b in zip(leaves, expected_leaves):
        if isinstance(b, torch.Tensor):
            torch.testing.assert_close(a, b)
        else:
            assert type(a) is type(b) and a == b


@pytest.mark.parametrize("fn", [_to_a_device_by_name, _from_the_input_device, _by_keywords, _as_dict_keys,
                                _compared, _returned], ids=lambda f: f.__name__)
def test_a_device_built_from_constants_stays_in_one_graph(fn):
    e = explain(fn)(torch.randn(3))
    assert e.eager_frames == [] and e.break_count == 0 and len(e.graphs) == 1
    cf = capture(fn, fullgraph=True)
    for _ in range(2):
        x = torch.randn(3)
        _assert_same(cf(x), fn(x))
    assert cf.stats.captures == 1


def _named_after_the_input(x):
    return x.new_zeros(2, device=torch.device(x.device.type)) + 1, str(torch.device(x.device))


def test_a_device_built_from_the_input_device_follows_it():
    cf = capture(_named_after_the_input, fullgraph=True)
    for device in ("cpu", "meta", "cpu"):
        x = torch.randn(2, device=device)
        (y, name), (expected, expected_name) = cf(x), _named_after_the_input(x)
        assert name == expected_name == device and y.device == expected.device
    assert cf.stats.captures == 2  # once per input device


def _nonsense(x):
    return x + 1, torch.device("nonsense")


def _negative_index(x):
    return x * 2, torch.device("cpu", -5)


def _wrong_type(x):
    return x - 1, torch.device(1.5)


@pytest.mark.parametrize("fn", [_nonsense, _negative_index, _wrong_type], ids=lambda f: f.__name__)
def test_an_invalid_device_raises_as_in_eager(fn):
    x = torch.randn(3)
    with pytest.raises(Exception) as eager:
        fn(x)
    with pytest.raises(eager.type) as compiled:
        capture(fn)(x)
    assert str(compiled.value) == str(eager.value)
    with pytest.raises(CaptureError) as whole:
        capture(fn, fullgraph=True)(x)
    assert f"the traced code raised {eager.type.__name__}" in str(whole.value)


def _caught(x):
    try:
        d = torch.device("nonsense")
    except RuntimeError:
        d = torch.device("cpu")
    return x.to(d) * 2


def test_an_invalid_device_caught_in_the_traced_code_stays_in_one_graph():
    e = explain(_caught)(torch.randn(3))
    assert e.eager_frames == [] and e.break_count == 0 and len(e.graphs) == 1
    x = torch.randn(3)
    torch.testing.assert_close(capture(_caught, fullgraph=True)(x), _caught(x))


def _index_in_a_tensor(x):
    # torch takes the index from a 0-d tensor: data, not a constant of the trace
    return x + 1, torch.device("cuda", (x.sum() * 0 + 1).int()).index


def _index_from_a_size(x):
    return x + 1, torch.device("cuda", x.shape[0] - 2).index


@pytest.mark.parametrize("case", [(_index_in_a_tensor, None, "not constants"),
                                  (_index_from_a_size, True, "symbolic size")], ids=lambda c: c[0].__name__)
def test_a_device_built_from_data_breaks_the_graph_there(case):
    fn, dynamic, reason = case
    e = explain(fn, dynamic=dynamic)(torch.randn(4))
    assert e.eager_frames == [] and e.break_count == 1
    assert any(reason in r.reason for r in e.break_reasons)
    cf = capture(fn, dynamic=dynamic)
    for n in (3, 4, 5):
        x = torch.randn(n)
        torch.testing.assert_close(cf(x), fn(x))
    assert cf.stats.fallbacks == 0
