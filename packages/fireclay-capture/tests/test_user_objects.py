"""User objects created or read inside the trace: __slots__ classes, Sequence subclasses, and
classes that compute attributes in Python (``__getattribute__`` / ``__getattr__``)."""

from __future__ import annotations

from collections.abc import Sequence

import pytest
import torch

from fireclay_capture import capture


class _Pair:
    __slots__ = ("left", "right")

    def __init__(self, left, right):
        self.left = left
        self.right = right


class _Triple(_Pair):
    __slots__ = ("extra",)

    def __init__(self, left, right, extra):
        super().__init__(left, right)
        self.extra = extra


class _SlotsWithDict(_Pair):  # no __slots__ of its own: instances have a __dict__
    def __init__(self, left, right):
        super().__init__(left, right)
        self.note = left * 2


def _make_pair(x):
    p = _Pair(x.sin(), x * 2)
    return p.left + p.right


def _make_triple(x):
    t = _Triple(x + 1, x - 1, 3.0)
    return t.left * t.extra - t.right


def _make_slots_with_dict(x):
    s = _SlotsWithDict(x, x + 1)
    return s.note + s.right


def _return_pair(x):
    return _Triple(x.relu(), [x * 3, x.cos()], "tag")


@pytest.mark.parametrize("fn", [_make_pair, _make_triple, _make_slots_with_dict], ids=lambda f: f.__name__)
@pytest.mark.parametrize("shape", [(3,), (2, 5)])
def test_creating_slots_instances_matches_eager(fn, shape):
    f = capture(fn, fullgraph=True)
    for _ in range(2):
        x = torch.randn(shape)
        torch.testing.assert_close(f(x), fn(x))


@pytest.mark.parametrize("shape", [(4,), (2, 3)])
def test_slots_instance_holding_tensors_is_rebuilt_as_an_output(shape):
    f = capture(_return_pair, fullgraph=True)
    x = torch.randn(shape)
    got, want = f(x), _return_pair(x)
    assert type(got) is _Triple and not hasattr(got, "__dict__")
    torch.testing.assert_close(got.left, want.left)
    torch.testing.assert_close(got.right, want.right)
    assert got.extra == want.extra


def _set_undeclared(x):
    p = _Pair(x, x)
    try:
        p.other = 1
    except AttributeError:
        return x + 1
    return x - 1


class _HalfSet:
    __slots__ = ("a", "b")

    def __init__(self, a):
        self.a = a


def _read_unset_slot(x):
    p = _HalfSet(x)
    if hasattr(p, "b"):
        return p.b
    return getattr(p, "b", p.a * 2) + getattr(p, "a", None)


def test_unset_slot_reads_as_missing_attribute_in_one_graph():
    f = capture(_read_unset_slot, fullgraph=True)
    for _ in range(2):
        x = torch.randn(3)
        torch.testing.assert_close(f(x), _read_unset_slot(x))


def test_setting_an_undeclared_slot_raises_as_eagerly():
    # try/except is outside what the trace models: the capture gives the frame back to eager
    # Python, which must see the same AttributeError the class raises.
    f = capture(_set_undeclared)
    for _ in range(2):
        x = torch.randn(3)
        torch.testing.assert_close(f(x), _set_undeclared(x))
        torch.testing.assert_close(f(x), x + 1)


class _Rows(Sequence):
    def __init__(self, rows):
        self._rows = rows

    def __len__(self):
        return len(self._rows)

    def __getitem__(self, i):
        return self._rows[i] * (i + 1)


def _iterate_new_sequence(x):
    total = x * 0
    for row in _Rows([x, x.exp(), x.tanh()]):
        total = total + row
    return total, list(_Rows([x, x]))[1]


def _iterate_outer_sequence(rows, x):
    return sum(r.sum() for r in rows) * x, [r for r in rows][0] + x


@pytest.mark.parametrize("n", [1, 3])
def test_sequence_subclasses_iterate_by_index(n):
    f = capture(_iterate_new_sequence, fullgraph=True)
    x = torch.randn(4)
    for a, b in zip(f(x), _iterate_new_sequence(x)):
        torch.testing.assert_close(a, b)
    g = capture(_iterate_outer_sequence, fullgraph=True)
    rows = _Rows([torch.randn(4) for _ in range(n)])
    for a, b in zip(g(rows, x), _iterate_outer_sequence(rows, x)):
        torch.testing.assert_close(a, b)


class _Aliased:
    """Names in ``_aliases`` read another attribute, the way transformers configs do."""

    _aliases = {"width": "hidden"}

    def __init__(self, hidden):
        self.hidden = hidden

    def __getattribute__(self, name):
        if name != "_aliases" and name in type(self)._aliases:
            name = type(self)._aliases[name]
        return super().__getattribute__(name)

    def scaled(self, x):
        return x * self.width


class _Fallback:
    def __init__(self, base):
        self.base = base

    def __getattr__(self, name):
        if name.startswith("twice_"):
            return 2 * getattr(self, name[len("twice_"):])
        raise AttributeError(name)


def _use_aliased(cfg, x):
    return x * cfg.width + cfg.scaled(x)


def _use_fallback(cfg, x):
    return x + cfg.twice_base


@pytest.mark.parametrize("fn,make", [(_use_aliased, _Aliased), (_use_fallback, _Fallback)],
                         ids=["getattribute", "getattr"])
def test_attributes_computed_in_python_are_read_and_guarded(fn, make):
    f = capture(fn, fullgraph=True)
    cfg = make(2.0)
    for value in (2.0, 5.0, 2.0):
        cfg.__dict__["hidden" if make is _Aliased else "base"] = value
        x = torch.randn(3)
        torch.testing.assert_close(f(cfg, x), fn(cfg, x))
    # A changed computed attribute re-captured (the guard reads it the same way).
    assert f.stats.captures == 2


class _LayerKinds(_Aliased):
    """A property that builds a new list on every read, behind ``__getattribute__`` (Jamba's
    ``config.layer_types``): each read is another object reached through one source."""

    def __init__(self, n):
        super().__init__(1.0)
        self.n = n

    @property
    def kinds(self):
        return ["attention" if i % 2 else "mamba" for i in range(self.n)]


def _per_layer_kind(cfg, x):
    for i in range(cfg.n):
        x = x * 2 if cfg.kinds[i] == "attention" else x + 1
    return x


@pytest.mark.parametrize("n", [1, 2, 3])
def test_a_property_making_a_new_list_per_read_is_read_each_time(n):
    f = capture(_per_layer_kind, fullgraph=True)
    cfg = _LayerKinds(n)
    for _ in range(2):
        x = torch.randn(4)
        torch.testing.assert_close(f(cfg, x), _per_layer_kind(cfg, x))
    assert f.stats.captures == 1


class _Celsius:
    __slots__ = ("_kelvin",)

    def __init__(self, degrees):
        self.degrees = degrees  # through the property's setter

    @property
    def degrees(self):
        return self._kelvin - 273.15

    @degrees.setter
    def degrees(self, value):
        self._kelvin = value + 273.15


def _through_property(x):
    c = _Celsius(x * 2)
    c.degrees = c.degrees + 1.0
    return c.degrees, c._kelvin


@pytest.mark.parametrize("shape", [(3,), (2, 2)])
def test_property_setter_runs_on_a_new_slots_object(shape):
    f = capture(_through_property, fullgraph=True)
    x = torch.randn(shape)
    for a, b in zip(f(x), _through_property(x)):
        torch.testing.assert_close(a, b)


class _Node:
    def __init__(self, value):
        self.value = value
        self.me = self


def _shared_objects(x):
    p = _Pair(x + 1, None)
    node = _Node(x * 2)
    return p, [p, node], {"n": node}


def test_an_object_returned_twice_is_rebuilt_once():
    f = capture(_shared_objects, fullgraph=True)
    for _ in range(2):
        x = torch.randn(3)
        (p, (p2, node), d), (ep, _, ed) = f(x), _shared_objects(x)
        assert p is p2 and d["n"] is node and node.me is node
        torch.testing.assert_close(p.left, ep.left)
        torch.testing.assert_close(node.value, ed["n"].value)
