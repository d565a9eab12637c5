"""A table of changes a compiled call must notice: each one makes the next call capture again
(and agree with eager), whatever shortcuts the generated guard function takes on the call that
passes (tuple blocks entered only for a new tuple, weights tested by identity first, contiguity
instead of strides, ``is_cpu`` instead of the device)."""

from __future__ import annotations

import pytest
import torch
import torch.nn as nn

from fireclay_capture import capture
from fireclay_capture.guards import GuardSet
from fireclay_capture.sources import LocalSource

OFFSET = 0.5


def _shifted(x, by=1.0, times=2):
    return (x + by) * times


def _make_scaler(factor):
    def scale(x):
        return x * factor

    return scale


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(4, 4)
        self.norm = nn.LayerNorm(4)
        self.drop = nn.Dropout(0.5)
        self.gain = nn.Parameter(torch.rand(4) + 0.5)
        self.register_buffer("shift", torch.randn(4))
        self.alpha = 1.5
        self.sizes = (2, 3)
        self.scale = _make_scaler(2.0)

    def forward(self, x):
        y = self.drop(self.norm(self.lin(x))) * self.gain * self.alpha
        y = y + self.shift + OFFSET + torch.ones(4).sum() * self.sizes[0]
        return self.scale(_shifted(y))


def _replace_gain(m):
    m.gain = nn.Parameter(torch.rand(4) + 2.0)


def _set_data(name, make):
    def change(m):
        p = getattr(m.lin, name) if name in ("weight", "bias") else getattr(m, name)
        p.data = make(p.data)
    return change


def _set(attr, value):
    def change(m):
        setattr(m, attr, value)
    return change


def _set_global(monkeypatch):
    monkeypatch.setitem(globals(), "OFFSET", 3.0)


def _swap_linear(m):
    m.lin = nn.Linear(4, 4)


def _hook(m):
    m.norm.register_forward_hook(lambda mod, args, out: out * 10)


def _new_defaults(monkeypatch):
    monkeypatch.setattr(_shifted, "__defaults__", (5.0, 2))


def _same_defaults_new_tuple(monkeypatch):
    monkeypatch.setattr(_shifted, "__defaults__", (1.0, 2))  # equal values: the tuple block's slow path


def _new_closure(m):
    m.scale = _make_scaler(-1.0)


def _cell_contents(m):
    m.scale.__closure__[0].cell_contents = 7.0


def _replace_buffer(m):
    m.shift = torch.full((4,), 9.0)


def _default_dtype(m):
    torch.set_default_dtype(torch.float64)  # the test puts it back


# (name, change, expect a new capture). A change takes the module (or, with a monkeypatch
# parameter, the test's monkeypatch).
CHANGES = [
    ("parameter replaced", _replace_gain, True),
    ("parameter dtype (data)", _set_data("gain", lambda d: d.double()), True),
    ("parameter shape (data)", _set_data("gain", lambda d: d[:1].clone()), True),
    ("parameter strides (data)", _set_data("weight", lambda d: d.t().contiguous().t()), True),
    ("parameter requires_grad", lambda m: m.gain.requires_grad_(False), True),
    ("parameter values (in place)", lambda m: m.gain.data.mul_(3), False),
    ("parameter storage (same layout)", _set_data("gain", lambda d: d * 4), False),
    ("buffer replaced", _replace_buffer, True),
    ("module attribute", _set("alpha", 2.5), True),
    ("module attribute, int for float", _set("alpha", 1), True),
    ("module tuple attribute", _set("sizes", (5, 3)), True),
    ("training flag", lambda m: m.train(), True),
    ("submodule swapped", _swap_linear, True),
    ("forward hook on a submodule", _hook, True),
    ("global", _set_global, True),
    ("function defaults", _new_defaults, True),
    ("function defaults, equal new tuple", _same_defaults_new_tuple, False),
    ("closure replaced", _new_closure, True),
    ("closure cell contents", _cell_contents, True),
    ("torch default dtype", _default_dtype, True),
]


@pytest.mark.parametrize("name,change,recaptures", CHANGES, ids=[c[0] for c in CHANGES])
def test_a_change_is_noticed(name, change, recaptures, monkeypatch):
    torch.manual_seed(0)
    m = Block().eval()
    cf = capture(m)  # not fullgraph: a hooked submodule is run between graphs
    x = torch.randn(3, 4)
    torch.testing.assert_close(cf(x), m(x))
    assert cf.stats.captures == 1 and cf.stats.cache_hits == 0
    default_dtype = torch.get_default_dtype()
    try:
        change(monkeypatch if change.__code__.co_varnames[:1] == ("monkeypatch",) else m)
        got, expected = cf(x), m(x)
    finally:
        torch.set_default_dtype(default_dtype)
    # the first entry must not serve a call after a change it depends on
    assert cf.stats.cache_hits == (0 if recaptures else 1), cf.cache.entries[0].guards.source
    assert got.dtype == expected.dtype and got.requires_grad == expected.requires_grad
    if name != "training flag":  # dropout draws: compared by the fraction of zeros in test_guards
        torch.testing.assert_close(got, expected)


def test_grad_mode_and_autocast_are_noticed():
    m = Block().eval()
    cf = capture(m, fullgraph=True)
    x = torch.randn(3, 4)
    with torch.no_grad():
        cf(x)
    out = cf(x)
    assert out.requires_grad and cf.stats.captures == 2
    with torch.autocast("cpu", dtype=torch.bfloat16):
        got, expected = cf(x), m(x)
    assert got.dtype == expected.dtype
    assert cf.stats.captures == 3


def _tensor_guard(t):
    guards = GuardSet()
    guards.tensor(LocalSource("t"), t)
    return guards.compile([LocalSource("t")])


@pytest.mark.parametrize("other", [
    "meta device", "shape", "dtype", "requires_grad", "strides", "strides of a size-1 dim", "subclass",
])
def test_tensor_metadata_table(other):
    t = torch.randn(2, 3) if other != "strides of a size-1 dim" else torch.randn(1, 3)
    check = _tensor_guard(t)
    assert check({"t": t}) == [t]
    changed = {
        "meta device": lambda: torch.empty(2, 3, device="meta"),
        "shape": lambda: torch.randn(3, 2),
        "dtype": lambda: t.double(),
        "requires_grad": lambda: t.clone().requires_grad_(),
        "strides": lambda: torch.randn(3, 2).t(),
        "strides of a size-1 dim": lambda: torch.randn(3, 1).t(),  # contiguous, but strides (1, 1)
        "subclass": lambda: nn.Parameter(t.clone()),
    }[other]()
    assert check({"t": changed}) is None
    assert check.first_failure({"t": changed}) is not None


def test_items_of_an_unchanged_tuple_are_checked_once():
    """A function's defaults: the guard enters their item checks only for a new tuple."""
    def g(x, a=1, b="s", c=None):
        return x + a if c is None and b == "s" else x

    def f(x):
        return g(x) * 2

    cf = capture(f, fullgraph=True)
    x = torch.randn(3)
    cf(x)
    source = cf.cache.entries[0].guards.source
    block = next(line for line in source.splitlines() if line.rstrip().endswith(":") and " is not k" in line)
    assert block.strip().startswith("if v") and "__defaults__" in source
    g.__defaults__ = (1, "s", None)  # equal, a new tuple: the slow path passes
    torch.testing.assert_close(cf(x), f(x))
    assert cf.stats.captures == 1
    g.__defaults__ = (2, "s", None)
    torch.testing.assert_close(cf(x), f(x))
    assert cf.stats.captures == 2
