"""Changes to objects that exist outside the frame are modelled during the trace and replayed
after the graph: every case runs eagerly and captured on equal fresh state, and the results, the
state afterwards (arguments, globals, module attributes) and the graph/break counts must match.
With ``config.replay_side_effects`` off, the same cases break at the change and still match."""

from __future__ import annotations

import copy

import pytest
import torch

from fireclay_capture import capture, config

G_LIST: list = []
G_COUNT = 0
G_TENSOR = None
G_DICT: dict = {}


def _reset_globals():
    global G_COUNT, G_TENSOR
    G_LIST.clear()
    G_DICT.clear()
    G_COUNT = 0
    G_TENSOR = None


def _globals_now():
    return [list(G_LIST), G_COUNT, G_TENSOR, dict(G_DICT)]


class Box:
    def __init__(self, n=0):
        self.a = torch.ones(2)
        self.b = torch.zeros(2)
        self.n = n
        self.items = []


class Stateful(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(4, 4)
        self.register_buffer("running", torch.zeros(4))
        self.calls = 0
        self.last = None
        self.history = []

    def forward(self, x):
        self.calls += 1
        y = self.lin(x)
        self.running = self.running * 0.9 + y.mean(0) * 0.1
        self.last = y.detach()
        self.history.append(self.calls)
        return y.relu() + self.running


# -- the cases: each is (function, make arguments, (graphs, breaks) of one first call)

def append_then_read(x, lst):
    lst.append(x.sin())
    return lst[-1] * 2 + len(lst)


def extend_insert_pop(x, lst):
    lst.extend([x + 1, 3])
    lst.insert(0, x * 2)
    first = lst.pop(0)
    last = lst.pop()
    return first + last


def pop_argument_list(x, lst):
    t = lst.pop(0)
    return x * t, len(lst)


def remove_and_clear(x, lst, other):
    lst.remove(3)
    other.clear()
    return x + len(lst) + len(other)


def setitem_delitem(x, lst):
    lst[0] = x.cos()
    del lst[1]
    return lst[0] + 1


def list_iadd(x, lst):
    lst += [x * 3]
    return len(lst) * x


def dict_changes(x, d):
    d["seen"] = x.clone()
    d.update(count=2, total=x.sum())
    d.setdefault("fresh", 5)
    old = d.pop("bias")
    del d["count"]
    return x + old + d["fresh"]


def dict_clear(x, d):
    n = len(d)
    d.clear()
    d["n"] = n
    return x * n


def same_list_twice(x, a, b):
    a.append(x)
    b.append(x * 2)
    return x + len(a) + len(b), a is b


def returns_its_argument(x, lst):
    lst.append(x + 1)
    return lst


def nested_container(x, state):
    state["hist"].append(x.mean())
    state["steps"] = state["steps"] + 1
    return x * state["steps"]


def global_counter(x):
    global G_COUNT
    G_COUNT = G_COUNT + 1
    return x + G_COUNT


def global_tensor_and_list(x):
    global G_TENSOR
    y = x.tanh()
    G_TENSOR = y
    G_LIST.append(y * 2)
    G_DICT["last"] = len(G_LIST)
    return G_TENSOR + G_LIST[-1]


def global_list_through_argument(x, lst):
    lst.append(1)  # the same list as G_LIST
    G_LIST.append(2)
    return x * len(lst)


def swap_attributes(x, box):
    box.a, box.b = box.b, box.a
    box.n += 1
    return x + box.a


def new_list_stored_and_returned(x, box):
    items = [x, x * 2]
    box.items = items
    return items


def print_between_changes(x, lst, box):
    lst.append(x.sum())
    box.n = box.n + 1
    print("between", len(lst))
    lst.append(x.max())
    box.a = x * box.n
    return x - 1


def _t():
    return torch.randn(3)


CASES = {
    "append_then_read": (append_then_read, lambda: (_t(), [_t()]), (1, 0)),
    "extend_insert_pop": (extend_insert_pop, lambda: (_t(), [_t(), 7]), (1, 0)),
    "pop_argument_list": (pop_argument_list, lambda: (_t(), [_t(), _t()]), (1, 0)),
    "remove_and_clear": (remove_and_clear, lambda: (_t(), [1, 3, 5], {"k": 1}), (1, 0)),
    "setitem_delitem": (setitem_delitem, lambda: (_t(), [_t(), _t(), _t()]), (1, 0)),
    "list_iadd": (list_iadd, lambda: (_t(), [_t()]), (1, 0)),
    "dict_changes": (dict_changes, lambda: (_t(), {"bias": _t(), "keep": 1}), (1, 0)),
    "dict_clear": (dict_clear, lambda: (_t(), {"a": 1, "b": _t()}), (1, 0)),
    "same_list_twice": (same_list_twice, lambda: (lambda lst: (_t(), lst, lst))([_t()]), (1, 0)),
    "returns_its_argument": (returns_its_argument, lambda: (_t(), [_t()]), (1, 0)),
    "nested_container": (nested_container, lambda: (_t(), {"hist": [], "steps": 1}), (1, 0)),
    "global_counter": (global_counter, lambda: (_t(),), (1, 0)),
    "global_tensor_and_list": (global_tensor_and_list, lambda: (_t(),), (1, 0)),
    "global_list_through_argument": (global_list_through_argument, lambda: (_t(), G_LIST), (1, 0)),
    "swap_attributes": (swap_attributes, lambda: (_t()[:2], Box()), (1, 0)),
    "new_list_stored_and_returned": (new_list_stored_and_returned, lambda: (_t(), Box()), (1, 0)),
    "print_between_changes": (print_between_changes, lambda: (_t(), [_t()], Box()), (2, 1)),
}


def same(a, b):
    if isinstance(a, torch.Tensor):
        torch.testing.assert_close(a, b)
    elif isinstance(a, (list, tuple)):
        assert type(a) is type(b) and len(a) == len(b)
        for p, q in zip(a, b):
            same(p, q)
    elif isinstance(a, dict):
        assert list(a) == list(b)
        for k in a:
            same(a[k], b[k])
    elif isinstance(a, (Box, torch.nn.Module)):
        same({k: v for k, v in vars(a).items() if not k.startswith("_")}, {k: v for k, v in vars(b).items() if not k.startswith("_")})
    else:
        assert a == b


def _run_both(fn, make, compiled, seed):
    torch.manual_seed(seed)
    args = make()
    _reset_globals()
    # A global passed as an argument stays that global in the eager run too.
    eager_args = tuple(G_LIST if a is G_LIST else c for a, c in zip(args, copy.deepcopy(args)))
    expected = fn(*eager_args)
    eager_state = copy.deepcopy((_globals_now(), list(eager_args)))
    _reset_globals()
    actual = compiled(*args)
    same(actual, expected)
    same((_globals_now(), list(args)), eager_state)
    return args, actual


@pytest.mark.parametrize("replay", [True, False], ids=["replay", "break"])
@pytest.mark.parametrize("name", sorted(CASES))
def test_changes_replayed_as_eagerly(name, replay, monkeypatch):
    monkeypatch.setattr(config, "replay_side_effects", replay)
    fn, make, counts = CASES[name]
    compiled = capture(fn)
    for seed in range(3):
        args, actual = _run_both(fn, make, compiled, seed)
        if name == "returns_its_argument":
            assert actual is args[1]  # the caller's own list, changed in place
        if name == "new_list_stored_and_returned":
            assert actual is args[1].items  # one list, reached twice
    fresh = capture(fn)
    torch.manual_seed(0)
    fresh(*make())
    if replay:
        assert (fresh.graph_count(), fresh.break_count()) == counts
    else:
        assert fresh.break_count() >= counts[1]
    assert fresh.stats.fallbacks == 0 or not replay


def test_module_state_counters_buffers_and_lists():
    eager_m, m = Stateful(), Stateful()
    m.load_state_dict(eager_m.state_dict())
    compiled = capture(m)
    for _ in range(3):
        x = torch.randn(2, 4)
        same(compiled(x), eager_m(x))
        same(m, eager_m)
        torch.testing.assert_close(m.running, eager_m.running)
    assert m.calls == 3 and m.history == [1, 2, 3]
    assert compiled.break_count() == 0 and compiled.stats.fallbacks == 0
    assert "running" in m._buffers  # assigned through nn.Module.__setattr__: still a buffer


def test_global_counter_is_exact_over_calls():
    _reset_globals()
    compiled = capture(global_counter)
    for i in range(4):
        x = torch.randn(3)
        torch.testing.assert_close(compiled(x), x + (i + 1))
        assert G_COUNT == i + 1
    # The counter is read as a constant (guarded), so each value is traced once more.
    assert compiled.stats.captures == 4 and compiled.break_count() == 0


def test_a_guard_on_the_changed_list_keeps_a_stale_entry_out():
    compiled = capture(append_then_read)
    for lst in ([torch.ones(3)], [torch.ones(3), torch.ones(3)], [torch.ones(3)]):
        x = torch.randn(3)
        expected = append_then_read(x, copy.deepcopy(lst))
        torch.testing.assert_close(compiled(x, lst), expected)
    assert compiled.stats.captures == 2 and compiled.stats.cache_hits == 1


def test_object_keyed_dict_change_is_not_replayed_wrongly():
    key = object()

    def fn(x, d):
        d[key] = x
        return x + 1

    compiled = capture(fn)
    d = {}
    torch.testing.assert_close(compiled(torch.ones(2), d), torch.ones(2) + 1)
    assert list(d) == [key]


def _appends_then_breaks(lst, x):
    lst.append(x * 2)
    G_LIST.append(len(lst))
    print("break inside the callee")
    return x + 1


def callee_changes_then_breaks(x, lst):
    y = _appends_then_breaks(lst, x)
    lst.append(y)
    return y * len(lst)


def test_changes_of_a_callee_that_breaks_happen_once():
    # The break inside the callee splits the caller at the call: what the callee's trace
    # changed is forgotten, and the callee runs (captured on its own) exactly once.
    compiled = capture(callee_changes_then_breaks)
    for seed in range(3):
        _run_both(callee_changes_then_breaks, lambda: (torch.randn(3), [torch.randn(3)]), compiled, seed)
    assert compiled.stats.fallbacks == 0 and compiled.break_count() >= 1
