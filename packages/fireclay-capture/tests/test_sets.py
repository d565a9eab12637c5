"""``set`` values inside captured code: built in the trace or read from a module or a global,
iterated in the order eager's set has (so values that depend on that order match), membership,
the set methods and operators; a set that exists outside the function is pinned by a guard."""

from __future__ import annotations

import pytest
import torch

from fireclay_capture import capture, explain

NAMES = {"query", "key", "value", "gate", "up", "down", "norm", "bias"}
WEIGHTS = {n: float(i + 1) for i, n in enumerate(sorted(NAMES))}


def _order_sensitive(x, names):
    # Each member scales one slice: the result depends on the iteration order.
    return torch.stack([x * WEIGHTS[n] for n in names])


def iterate_a_global_set(x):
    return _order_sensitive(x, NAMES)


def iterate_a_set_built_in_the_trace(x):
    s = {"up", "down", "gate", "query"}
    s.add("key")
    s.discard("gate")
    return _order_sensitive(x, s)


def set_comprehension_and_membership(x):
    s = {n for n in NAMES if len(n) > 3}
    return x * (2 if "query" in s else 3) + (1 if "key" in s else 0) + len(s)


def set_of_ints_methods(x):
    a = set(range(6))
    b = {4, 5, 6, 7}
    c = a.union(b).difference({0}).intersection({1, 2, 5, 6, 9})
    a.update(b)
    a.difference_update({1})
    return x * sum(c) + len(a) + (1 if c.issubset(a) else 0) + sorted(a)[2]


def set_operators(x):
    a = {"query", "key", "up"}
    b = NAMES - {"up"}
    both = a & b
    either = a | b
    only = either ^ both
    a |= {"norm"}
    return _order_sensitive(x, only) + len(both) + (a <= NAMES) + (both < either)


def sorted_and_list_of_a_set(x):
    s = {"b", "c", "a"}
    order = list(s)
    return x * len(order) + sorted(s).index("c")


def set_pop_and_remove(x):
    s = {"up", "down", "norm"}
    first = s.pop()
    s.remove("norm") if "norm" in s else s.remove("up")
    return x * WEIGHTS[first] + len(s)


def frozenset_of_a_set(x):
    f = frozenset({"up", "down"}) | {"gate"}
    return _order_sensitive(x, f)


def copy_of_a_global_set(x):
    s = set(NAMES)
    s.discard("bias")
    return _order_sensitive(x, s)


class Layers(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.kinds = ["full", "sliding", "full", "chunked"]
        self.unique_kinds = set(self.kinds)
        self.scale = torch.nn.ModuleDict({k: torch.nn.Linear(4, 4) for k in self.unique_kinds})

    def forward(self, x):
        per_kind = {}
        for kind in self.unique_kinds:
            per_kind[kind] = self.scale[kind](x)
        return torch.cat([per_kind[k] for k in self.kinds] + list(per_kind.values()), dim=-1)


CASES = [iterate_a_global_set, iterate_a_set_built_in_the_trace, set_comprehension_and_membership,
         set_of_ints_methods, set_operators, sorted_and_list_of_a_set, set_pop_and_remove, frozenset_of_a_set,
         copy_of_a_global_set]


@pytest.mark.parametrize("fn", CASES, ids=lambda f: f.__name__)
def test_set_matches_eager_in_one_graph(fn):
    compiled = capture(fn, fullgraph=True)
    for _ in range(2):
        x = torch.randn(3)
        torch.testing.assert_close(compiled(x), fn(x))
    assert compiled.stats.captures == 1


def test_a_set_attribute_of_a_module_in_one_graph():
    model = Layers()
    x = torch.randn(2, 4)
    e = explain(model)(x)
    assert (e.graph_count, e.break_count) == (1, 0)
    compiled = capture(model, fullgraph=True)
    torch.testing.assert_close(compiled(x), model(x))


def test_a_changed_global_set_is_captured_again():
    names = {"up", "down"}

    def fn(x):
        return _order_sensitive(x, names) + len(names)

    compiled = capture(fn)
    x = torch.randn(3)
    torch.testing.assert_close(compiled(x), fn(x))
    names.add("gate")
    torch.testing.assert_close(compiled(x), fn(x))
    assert compiled.stats.captures == 2


def test_changing_a_set_that_exists_outside_matches_eager():
    seen = {"a"}

    def fn(x):
        seen.add("b")
        return x * len(seen)

    x = torch.randn(3)
    expected = fn(x)
    seen.discard("b")
    torch.testing.assert_close(capture(fn)(x), expected)
    assert seen == {"a", "b"}
