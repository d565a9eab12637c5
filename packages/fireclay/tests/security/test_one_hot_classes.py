"""``one_hot`` refuses a class outside ``[0, num_classes)`` as eager does (issue 23): its composite
kernel drops the check on traced (fake) tensors, and the compiled program gave a row of zeros.
The aten graph now keeps ``aten::one_hot`` whole and the kernels check each class; with
``num_classes=-1`` (the count read from the data) the call runs eagerly."""

from __future__ import annotations

import pytest
import torch

import fireclay

F = torch.nn.functional
CLASSES = {"in_range": [0, 4, 2], "num_classes": [0, 5, 2], "above": [0, 9, 2], "negative": [0, -1, 2],
           "huge": [0, 2**40, 2], "huge_negative": [0, -(2**40), 2]}


def _one_hot_5(t, x):
    return F.one_hot(t, 5).float() * x


def _one_hot_inferred(t, x):
    return F.one_hot(t).float().sum(0) + x.sum()


def _one_hot_summed(t, x):
    return (F.one_hot(t, 5) * x).sum(1)  # the classes read inside a reduction


PROGRAMS = {"one_hot_5": (_one_hot_5, True), "one_hot_summed": (_one_hot_summed, True),
            "one_hot_inferred": (_one_hot_inferred, False)}  # (fullgraph: whether one graph holds it)
_COMPILED: dict = {}


def _compiled(name):
    if name not in _COMPILED:
        fn, fullgraph = PROGRAMS[name]
        _COMPILED[name] = fireclay.compile(fn, fullgraph=fullgraph)
    return _COMPILED[name]


@pytest.mark.parametrize("value", list(CLASSES))
@pytest.mark.parametrize("name", list(PROGRAMS))
def test_one_hot_raises_as_eager(name, value):
    fn = PROGRAMS[name][0]
    t, x = torch.tensor(CLASSES[value]), torch.randn(3, 5)
    try:
        want = fn(t, x)
    except Exception as error:  # noqa: BLE001 (eager's error is the expected result)
        with pytest.raises(type(error)):
            _compiled(name)(t, x)
        return
    torch.testing.assert_close(_compiled(name)(t, x), want)


def test_one_hot_is_one_aten_op_in_the_graph():
    """The aten graph holds ``aten::one_hot`` (the op the kernels check), not the ``eq`` against
    ``arange`` that the composite kernel gives on fake tensors."""
    from fireclay_autograd import trace_to_aten
    from fireclay_capture import capture

    graphs = []

    def record(program, example_inputs):
        graphs.append(trace_to_aten(program, example_inputs))
        return lambda *args: _one_hot_5(*args)

    capture(_one_hot_5, backend=record, fullgraph=True)(torch.tensor([0, 1, 2]), torch.randn(3, 5))
    ops = [n.op for n in graphs[0].main.nodes]
    assert "aten::one_hot.default" in ops and "aten::eq.Tensor" not in ops
