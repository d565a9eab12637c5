"""Guard soundness: whatever the trace relied on, changing it re-captures; never a stale result."""

from __future__ import annotations

import pytest
import torch
import torch.nn as nn

from fireclay_capture import capture, config

FACTOR = 2.0
USE_RELU = True


def uses_globals(x):
    y = x * FACTOR
    if USE_RELU:
        y = torch.relu(y)
    return y


def test_changing_a_global_recaptures(monkeypatch):
    f = capture(uses_globals, fullgraph=True)
    x = torch.randn(4)
    torch.testing.assert_close(f(x), uses_globals(x))
    monkeypatch.setitem(globals(), "FACTOR", 3.0)
    torch.testing.assert_close(f(x), uses_globals(x))
    monkeypatch.setitem(globals(), "USE_RELU", False)
    torch.testing.assert_close(f(x), uses_globals(x))
    assert (f.stats.captures, f.stats.recompiles) == (3, 2)
    # Back to a configuration seen before: served from the cache, no new capture.
    monkeypatch.setitem(globals(), "FACTOR", 2.0)
    monkeypatch.setitem(globals(), "USE_RELU", True)
    torch.testing.assert_close(f(x), uses_globals(x))
    assert f.stats.captures == 3 and f.stats.cache_hits == 1


def _plain(x, y):
    return x @ y + 1


@pytest.mark.parametrize("change", [
    "dtype", "shape", "rank", "requires_grad", "stride", "same_object_aliasing",
])
def test_tensor_property_change_recaptures(change):
    f = capture(_plain, fullgraph=True)
    x, y = torch.randn(3, 4), torch.randn(4, 5)
    torch.testing.assert_close(f(x, y), _plain(x, y))
    if change == "dtype":
        x, y = x.double(), y.double()
    elif change == "shape":
        x, y = torch.randn(2, 4), torch.randn(4, 5)
    elif change == "rank":
        x = torch.randn(2, 3, 4)
    elif change == "requires_grad":
        x = x.clone().requires_grad_(True)
    elif change == "stride":
        x = torch.randn(4, 3).t()
    elif change == "same_object_aliasing":
        x = torch.randn(4, 4)
        y = x
    out = f(x, y)
    expected = _plain(x, y)
    assert out.dtype == expected.dtype and out.requires_grad == expected.requires_grad
    torch.testing.assert_close(out, expected)
    assert (f.stats.captures, f.stats.recompiles) == (2, 1)


def test_aliased_inputs_are_one_graph_input_and_guarded():
    def f(a, b):
        a.add_(1)
        return a + b

    cf = capture(f, fullgraph=True)
    x = torch.zeros(3)
    out = cf(x, x)  # a and b are the same tensor: b sees the mutation
    torch.testing.assert_close(out, torch.full((3,), 2.0))
    assert len(cf.last_program.main.inputs) == 1
    y, z = torch.zeros(3), torch.zeros(3)
    torch.testing.assert_close(cf(y, z), torch.ones(3))
    assert cf.stats.captures == 2


def test_list_length_change_recaptures():
    def f(xs):
        return sum(xs)

    cf = capture(f, fullgraph=True)
    xs = [torch.randn(3) for _ in range(3)]
    torch.testing.assert_close(cf(xs), f(xs))
    xs4 = xs + [torch.randn(3)]
    torch.testing.assert_close(cf(xs4), f(xs4))
    torch.testing.assert_close(cf(xs[:2]), f(xs[:2]))
    assert cf.stats.captures == 3


def test_dict_keys_and_constant_values_recapture():
    def f(d):
        out = d["x"]
        for k, v in d.items():
            if k != "x":
                out = out * v
        return out

    cf = capture(f, fullgraph=True)
    x = torch.randn(3)
    for d in ({"x": x, "a": 2}, {"x": x, "a": 3}, {"x": x, "a": 2, "b": 5}, {"x": x}):
        torch.testing.assert_close(cf(d), f(d))
    assert cf.stats.captures == 4


class Configurable(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(4, 4)
        self.scale = 1.0
        self.drop = nn.Dropout(0.5)

    def forward(self, x):
        return self.drop(self.lin(x)) * self.scale


def test_module_attribute_change_recaptures():
    m = Configurable().eval()
    cf = capture(m, fullgraph=True)
    x = torch.randn(2, 4)
    torch.testing.assert_close(cf(x), m(x))
    m.scale = 5.0
    torch.testing.assert_close(cf(x), m(x))
    assert cf.stats.captures == 2


def test_training_flag_change_recaptures():
    m = Configurable().eval()
    cf = capture(m, fullgraph=True)
    x = torch.randn(200, 4)
    torch.testing.assert_close(cf(x), m(x))
    m.train()
    out = cf(x)
    # Dropout now zeroes about half of the entries: a stale eval-mode graph would not.
    assert (out == 0).float().mean() > 0.3
    assert cf.stats.captures == 2


def test_parameter_replacement_and_in_place_update():
    m = Configurable().eval()
    cf = capture(m, fullgraph=True)
    x = torch.randn(2, 4)
    cf(x)
    with torch.no_grad():
        m.lin.weight.mul_(2)  # in-place: same object, no re-capture, new values seen
    torch.testing.assert_close(cf(x), m(x))
    assert cf.stats.captures == 1
    m.lin.weight = nn.Parameter(torch.randn(4, 4))  # a new object: re-capture
    torch.testing.assert_close(cf(x), m(x))
    assert cf.stats.captures == 2


def test_submodule_swap_recaptures():
    m = Configurable().eval()
    cf = capture(m, fullgraph=True)
    x = torch.randn(2, 4)
    cf(x)
    m.lin = nn.Linear(4, 4)
    torch.testing.assert_close(cf(x), m(x))
    assert cf.stats.captures == 2


def test_grad_mode_change_recaptures():
    w = torch.randn(3, requires_grad=True)

    def f(x):
        return x * w

    cf = capture(f, fullgraph=True)
    x = torch.randn(3)
    assert cf(x).requires_grad
    with torch.no_grad():
        out = cf(x)
    assert not out.requires_grad
    assert cf.stats.captures == 2


def test_closure_cell_change_recaptures():
    k = 2

    def f(x):
        return x * k

    cf = capture(f, fullgraph=True)
    x = torch.randn(3)
    torch.testing.assert_close(cf(x), x * 2)
    k = 7  # noqa: F841 - read through the closure cell
    torch.testing.assert_close(cf(x), x * 7)
    assert cf.stats.captures == 2


def test_shadowing_a_builtin_recaptures(monkeypatch):
    def f(x):
        return x * len([1, 2, 3])

    cf = capture(f, fullgraph=True)
    x = torch.randn(3)
    torch.testing.assert_close(cf(x), x * 3)
    monkeypatch.setitem(globals(), "len", lambda v: 10)
    torch.testing.assert_close(cf(x), x * 10)
    assert cf.stats.captures == 2


def test_user_object_attribute_change_recaptures():
    class Cfg:
        def __init__(self):
            self.mult = 2

    cfg = Cfg()

    def f(x, c):
        return x * c.mult

    cf = capture(f, fullgraph=True)
    x = torch.randn(3)
    torch.testing.assert_close(cf(x, cfg), x * 2)
    cfg.mult = 4
    torch.testing.assert_close(cf(x, cfg), x * 4)
    assert cf.stats.captures == 2


def test_recompile_limit_falls_back_to_eager(monkeypatch):
    monkeypatch.setattr(config, "recompile_limit", 3)

    def f(x, n):
        return x * n

    cf = capture(f)
    x = torch.randn(3)
    with pytest.warns(UserWarning, match="recompile_limit"):
        for n in range(6):
            torch.testing.assert_close(cf(x, n), x * n)
    assert cf.stats.captures == 3
    assert cf.cache.given_up


def test_guard_function_is_generated_once_per_entry():
    cf = capture(_plain, fullgraph=True)
    x, y = torch.randn(3, 4), torch.randn(4, 5)
    cf(x, y)
    entry = cf.cache.entries[0]
    src = entry.guards.source
    assert src.startswith("def check_and_extract(L):")
    assert "(3, 4)" in src and "(4, 5)" in src
    assert entry.guards({"x": x, "y": y}) == [x, y]
    assert entry.guards({"x": x.double(), "y": y}) is None


def test_adding_a_hook_to_a_submodule_recaptures():
    m = Configurable().eval()
    cf = capture(m)
    x = torch.randn(2, 4)
    cf(x)
    m.lin.register_forward_hook(lambda mod, inp, out: out * 0)
    torch.testing.assert_close(cf(x), m(x))
    # The hooked submodule is called in plain Python at a graph break.
    assert (cf.stats.captures, cf.stats.fallbacks, cf.break_count()) == (2, 0, 1)


class Recorder:
    def __init__(self):
        self.last = None
        self.flag = False


def test_attribute_writes_are_replayed_after_the_graph():
    rec = Recorder()

    def f(x, r):
        y = x.sin()
        r.last = y  # a tensor produced by the graph
        r.flag = True
        r.flag = False  # restored: nothing to replay
        return y * 2

    cf = capture(f, fullgraph=True)
    for _ in range(2):
        x = torch.randn(3)
        out = cf(x, rec)
        torch.testing.assert_close(rec.last, x.sin())
        torch.testing.assert_close(out, x.sin() * 2)
        assert rec.flag is False
    assert cf.stats.captures == 1
    assert len(cf.cache.entries[0].replay.ops) == 1


def test_read_after_write_sees_the_written_value():
    rec = Recorder()

    def f(x, r):
        r.flag = True
        return x + 1 if r.flag else x - 1

    cf = capture(f, fullgraph=True)
    x = torch.randn(3)
    torch.testing.assert_close(cf(x, rec), x + 1)
    assert rec.flag is True


# -- the reason of a failed guard, in words: one row per guard kind

def _failure(install, L):
    from fireclay_capture.guards import GuardSet

    guards = GuardSet()
    install(guards)
    return guards.compile([]).first_failure(L)


def _guard_failures():
    from fireclay_capture.guards import global_state
    from fireclay_capture.sources import AttrSource, LocalSource

    x, y, n, m = (LocalSource(name) for name in "xynm")
    t = torch.randn(2, 3)
    module = nn.Linear(2, 2)
    hooked = nn.Linear(2, 2)
    hooked.register_forward_hook(lambda *a: None)
    shared = [1]
    return [
        ("type", lambda g: g.type_is(n, int), {"n": 2.5}, "L['n']: type expected int, got float"),
        ("id", lambda g: g.id_is(n, module), {"n": nn.Linear(2, 2)},
         "L['n']: expected the same object as when captured (Linear("),
        ("equals", lambda g: g.equals(n, 2), {"n": 3}, "L['n'] == 2 expected, got 3"),
        ("equals type", lambda g: g.equals(n, 2), {"n": "2"}, "L['n']: type expected int (2), got str"),
        ("tensor", lambda g: g.tensor(x, t), {"x": t.double()},
         "L['x']: dtype expected torch.float32, got torch.float64"),
        ("tensor kind", lambda g: g.tensor(x, t), {"x": 3}, "L['x']: expected a tensor, got int"),
        ("len", lambda g: g.length(n, list, 2), {"n": [1, 2, 3]}, "len(L['n']) == 2 expected, got 3"),
        ("dict_keys", lambda g: g.dict_keys(n, dict, ["a"]), {"n": {"b": 1}},
         "keys of L['n'] expected ['a'], got ['b']"),
        ("no_hooks", lambda g: g.no_hooks(n), {"n": hooked}, "L['n']: a forward hook was added"),
        ("not_in", lambda g: g.not_in(AttrSource(n, "__dict__"), "forward"), {"n": _with_forward()},
         "L['n'].__dict__: 'forward' appeared"),
        ("same", lambda g: g.same_object(x, y), {"x": [1], "y": [1]},
         "L['x']: expected the same object as L['y']"),
        ("distinct", lambda g: g.distinct([x, y]), {"x": shared, "y": shared},
         "expected different objects at L['x'], L['y']"),
        ("expr", lambda g: g.expression("L['m'] > 1"), {"m": 0}, "size guard L['m'] > 1"),
        ("global_state", lambda g: g.global_state(global_state()._replace(grad_mode=not torch.is_grad_enabled())),
         {}, f"global state: grad_mode expected {not torch.is_grad_enabled()}, got {torch.is_grad_enabled()}"),
        ("unreadable", lambda g: g.type_is(AttrSource(n, "missing"), int), {"n": object()},
         "L['n'].missing: could not be read (AttributeError"),
    ]


def _with_forward():
    obj = nn.Linear(2, 2)
    obj.forward = lambda x: x
    return obj


@pytest.mark.parametrize("kind", [row[0] for row in _guard_failures()])
def test_failed_guard_is_described_by_its_kind(kind):
    [(_, install, L, expected)] = [row for row in _guard_failures() if row[0] == kind]
    message = _failure(install, L)
    assert message is not None and message.startswith(expected), message


class Flagged(nn.Module):
    def __init__(self, flag):
        super().__init__()
        self.flag = flag

    def forward(self, x):
        if self.flag is None:
            return x - 1
        if self.flag is False:
            return x * 2
        if self.flag is True:
            return x * 3
        return x + self.flag  # 0 and 0.0 compare equal to False: they must not share its entry


def test_singleton_constants_are_guarded_by_identity():
    m = Flagged(None)
    cf = capture(m, fullgraph=True)
    x = torch.randn(3)
    values = [None, False, 0, 0.0, True, 1, None, False]
    for value in values:
        m.flag = value
        torch.testing.assert_close(cf(x), m(x))
    assert cf.stats.captures == 6  # None, False, 0, 0.0, True, 1; then hits
    source = cf.cache.entries[0].guards.source
    flag_line = next(line for line in source.splitlines() if ".flag" in line)
    name = flag_line.split("=")[0].strip()
    check = next(line for line in source.splitlines() if line.strip().startswith(f"if {name} ")
                 or f"({name})" in line)
    assert check.strip() == f"if {name} is not k{check.split(' is not k')[1].split(':')[0]}: return None"


def test_a_type_checked_once_is_not_checked_again():
    from fireclay_capture.guards import GuardSet
    from fireclay_capture.sources import LocalSource

    guards = GuardSet()
    d = LocalSource("d")
    guards.type_is(d, dict)
    guards.dict_keys(d, dict, ["a", "b"])
    guards.length(d, dict, 2)
    compiled = guards.compile([d])
    assert compiled.source.count("type(v0) is not") == 1, compiled.source
    value = {"a": 1, "b": 2}
    assert compiled({"d": value}) == [value]
    for other in ({"a": 1}, {"b": 1, "a": 2}, [("a", 1), ("b", 2)], None):
        assert compiled({"d": other}) is None
        assert compiled.first_failure({"d": other}) is not None


def test_numpy_scalar_arguments_are_numbers_pinned_by_type_and_value():
    # VITS multiplies a tensor by ``np.prod(...)``, whose NumPy scalar reaches a resume function.
    import numpy as np

    def fn(x, n):
        return x * n + n

    compiled = capture(fn)
    for n in [np.int64(3), np.int64(3), np.float32(2.5), 4, np.int64(3), np.int64(5)]:
        x = torch.randn(3)
        torch.testing.assert_close(compiled(x, n), fn(x, n))
    # one capture per (type, value): int64 3, float32 2.5, int 4, int64 5
    assert (compiled.stats.captures, compiled.stats.fallbacks) == (4, 0)
