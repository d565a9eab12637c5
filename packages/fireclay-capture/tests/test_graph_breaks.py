"""Graph breaks: the generated corpus (every breaker in every shape of code) against eager,
outputs and side effects, plus hand-written cases for side effects and the controls."""

from __future__ import annotations

import copy

import pytest
import torch
from breaks_corpus import build_module

from fireclay_capture import capture
from fireclay_capture.backends import lookup_backend
from fireclay_ir import verify

MODULE, CASES = build_module()


def inputs():
    return torch.randn(3, 3), torch.randn(3, 3)


def run_against_eager(fn, make_inputs, calls: int = 3):
    compiled = capture(fn)
    for _ in range(calls):
        args = make_inputs()
        MODULE.EVENTS.clear()
        expected = fn(*copy.deepcopy(args))
        eager_events = list(MODULE.EVENTS)
        MODULE.EVENTS.clear()
        actual = compiled(*args)
        assert list(MODULE.EVENTS) == eager_events
        torch.testing.assert_close(actual, expected, rtol=1e-5, atol=1e-5)
    return compiled


@pytest.mark.parametrize("name", sorted(CASES))
def test_break_matches_eager(name):
    run_against_eager(CASES[name], inputs)
    # Graphs (with at least one op) and breaks of one first call, resume functions included.
    compiled = capture(CASES[name])
    MODULE.EVENTS.clear()
    torch.manual_seed(0)  # branches on values: which resume functions run depends on the data
    compiled(*inputs())
    assert (compiled.graph_count(), compiled.break_count()) == EXPECTED_GRAPHS[name]
    for program in _all_programs(compiled):
        verify(program)


def _all_programs(compiled):
    yield from compiled.programs
    for child in compiled.children:
        yield from _all_programs(child)


# Breakers that stop the graph where they stand; the "quiet" ones (a global list append, logging)
# are replayed or skipped without a break; numpy ones break differently.
BREAKING = ("disabled", "graph_break", "id_builtin", "item", "item_branch", "print", "tensor_branch", "tolist")


def _expected(shape, breaking, *, quiet, numpy, numpy_call, **exceptions):
    """(graphs with at least one op, graph breaks) after one call of every breaker in ``shape``,
    resume functions and callees included; ``exceptions`` for breakers that differ."""
    counts = {b: exceptions.get(b, breaking) for b in BREAKING}
    counts |= {"global_append": quiet, "logging": quiet, "numpy": numpy, "numpy_call": numpy_call}
    return {f"{shape}__{b}": v for b, v in counts.items()}


# A break inside a try or with block resumes inside the block, like anywhere else.
EXPECTED_GRAPHS = {
    **_expected("after_no_grad", (2, 1), quiet=(1, 0), numpy=(1, 1), numpy_call=(2, 2)),
    **_expected("for_loop", (4, 3), quiet=(1, 0), numpy=(1, 1), numpy_call=(4, 6)),
    **_expected("for_over_list", (3, 2), quiet=(1, 0), numpy=(1, 1), numpy_call=(3, 4)),
    # helper's two calls (one from fn, one from fn's resume function) share one captured helper.
    **_expected("in_inlined_call", (3, 3), quiet=(1, 0), numpy=(2, 3), numpy_call=(3, 4), id_builtin=(4, 3)),
    **_expected("in_try_block", (2, 1), quiet=(1, 0), numpy=(1, 1), numpy_call=(2, 2)),
    **_expected("in_with_block", (2, 1), quiet=(1, 0), numpy=(1, 1), numpy_call=(2, 2)),
    **_expected("kwargs_and_defaults", (5, 4), quiet=(1, 0), numpy=(3, 4), numpy_call=(5, 6)),
    **_expected("nested_three_deep", (8, 4), quiet=(1, 0), numpy=(7, 4), numpy_call=(8, 5)),
    **_expected("result_in_tuple", (2, 1), quiet=(1, 0), numpy=(1, 1), numpy_call=(2, 2)),
    **_expected("straight", (2, 1), quiet=(1, 0), numpy=(1, 1), numpy_call=(2, 2)),
    **_expected("two_breaks", (3, 2), quiet=(1, 0), numpy=(1, 1), numpy_call=(3, 4)),
    **_expected("while_loop", (2, 2), quiet=(1, 0), numpy=(1, 1), numpy_call=(3, 4),
                id_builtin=(3, 2), item=(3, 2), item_branch=(3, 2), tolist=(3, 2)),
    # (numpy: the resume function runs eagerly and the function it calls is captured on its own)
    **_expected("closure_cells", (2, 1), quiet=(1, 0), numpy=(2, 1), numpy_call=(2, 2)),
    **_expected("contextmanager_block", (2, 4), quiet=(1, 3), numpy=(1, 3), numpy_call=(2, 5)),
    **_expected("loop_in_try", (4, 4), quiet=(1, 1), numpy=(1, 1), numpy_call=(4, 7),
                disabled=(3, 4), graph_break=(3, 4), print=(3, 4)),
    **_expected("nested_try_finally_raises", (2, 2), quiet=(1, 1), numpy=(1, 1), numpy_call=(2, 3)),
    **_expected("nonlocal_counter", (2, 1), quiet=(1, 0), numpy=(2, 1), numpy_call=(2, 2)),
    **_expected("three_deep_try_in_middle", (5, 5), quiet=(4, 4), numpy=(4, 4), numpy_call=(5, 6),
                disabled=(4, 5), graph_break=(4, 5), print=(4, 5)),
    **_expected("try_except_caught", (2, 2), quiet=(1, 1), numpy=(1, 1), numpy_call=(2, 3)),
    **_expected("try_finally", (2, 1), quiet=(1, 0), numpy=(1, 1), numpy_call=(2, 2)),
    **_expected("user_with_in_loop", (3, 2), quiet=(1, 0), numpy=(2, 1), numpy_call=(3, 4)),
    **_expected("user_with_suppresses", (2, 2), quiet=(1, 1), numpy=(1, 1), numpy_call=(2, 3)),
}


def test_loop_that_breaks_on_every_iteration_stays_bounded(caplog):
    def fn(x, n):
        for i in range(n):
            x = x * 1.01 + i
            MODULE.graph_break()
        return x

    compiled = capture(fn)
    with caplog.at_level("WARNING", logger="fireclay_capture"):
        for n in (3, 200):
            x = torch.randn(4)
            torch.testing.assert_close(compiled(x, n), fn(x, n))
    assert not [r for r in caplog.records if r.levelname == "WARNING"]


def _continue_a_loop(x, n):
    y = x + 1
    for i in range(n):
        y = y * 2
        print(i)
    return y


@pytest.mark.parametrize("remaining", [0, 1, 3])
def test_resume_function_reenters_a_loop_with_its_iterator(remaining):
    import dis

    from fireclay_capture.resume import ITER_SLOT, VALUE_SLOT, resume_function_for

    insts = list(dis.get_instructions(_continue_a_loop))
    print_call = [i for i in insts if i.opname == "CALL"][-1]
    after = next(i for i in insts if i.offset > print_call.offset)
    resume = resume_function_for(_continue_a_loop, after.offset, (ITER_SLOT, VALUE_SLOT),
                                 ("x", "n", "y", "i"))
    # Stopped after print(i) returned None, with `remaining` iterations left to run.
    items = tuple(range(10, 10 + remaining))
    assert resume(items, None, 0, 99, 5, 7) == 5 * 2 ** remaining
    assert resume.__code__.co_argcount == 6
    assert resume.__name__ == "resume_in__continue_a_loop"


def _no_grad_block_with_break(x, w, fail):
    with torch.no_grad():
        y = x * w
        print("inside", torch.is_grad_enabled())
        if fail:
            raise ValueError("raised inside the resumed block")
        y = y + 1
    return y * x, torch.is_grad_enabled()


@pytest.mark.parametrize("outer_grad", [True, False])
def test_break_inside_no_grad_resumes_in_the_block(outer_grad):
    compiled = capture(_no_grad_block_with_break)
    with torch.set_grad_enabled(outer_grad):
        for _ in range(3):
            x, w = torch.randn(3, requires_grad=True), torch.randn(3)
            (out, mode), (ref, ref_mode) = compiled(x, w, False), _no_grad_block_with_break(x, w, False)
            torch.testing.assert_close(out, ref)
            assert (mode, out.requires_grad) == (ref_mode, ref.requires_grad)
            assert torch.is_grad_enabled() is outer_grad
            with pytest.raises(ValueError, match="resumed block"):
                compiled(x, w, True)
            assert torch.is_grad_enabled() is outer_grad  # the block's exit ran on the way out
    assert compiled.break_count() >= 1 and compiled.stats.fallbacks == 0


_REFS: list = []


@MODULE.disable
def _make_big(x):
    big = x.repeat(256)
    _REFS.append(__import__("weakref").ref(big))
    return big


@MODULE.disable
def _first_big_alive():
    # Only references count here: garbage cycles left by tracing (collected at some later
    # point anyway) are collected first, so the answer does not depend on the collector's timing.
    __import__("gc").collect()
    return _REFS[-1]() is not None


def _rebinds_a_dead_big_tensor(x):
    big = _make_big(x)  # break: `big` comes back from plain Python
    s = big.sum()
    print("big is dead from here on")  # break: `big` is rebound below before any read
    big = s * 2
    alive = _first_big_alive()  # break: eagerly, the first tensor is gone by now
    return big + x, alive


def _keeps_a_live_big_tensor(x):
    big = _make_big(x)
    s = big.sum()
    print("big is still read below")
    alive = _first_big_alive()
    return big.mean() + s + x, alive


@pytest.mark.parametrize("fn", [_rebinds_a_dead_big_tensor, _keeps_a_live_big_tensor])
def test_a_local_dead_at_a_break_is_freed_as_eagerly(fn):
    compiled = capture(fn)
    for _ in range(2):
        x = torch.randn(64)
        expected, eager_alive = fn(x)
        actual, alive = compiled(x)
        torch.testing.assert_close(actual, expected)
        assert alive is eager_alive
    assert compiled.break_count() == 3 and compiled.stats.fallbacks == 0


def _resume_locals(compiled):
    names = set()
    for entry in compiled.cache.entries:
        if entry.graph_break is not None:
            names.add(entry.graph_break.local_names)
    for child in compiled.children:
        names |= _resume_locals(child)
    return names


def test_only_live_locals_cross_a_break():
    def fn(x, w):
        dead = x * 3  # noqa: F841 - never read again
        kept = x + w
        print("break")
        return kept * 2

    compiled = capture(fn)
    x, w = torch.randn(3), torch.randn(3)
    torch.testing.assert_close(compiled(x, w), fn(x, w))
    assert _resume_locals(compiled) == {("kept",)}


_SEEN: list = []


class _Recording:
    """Records which object entered and exited, and how."""

    def __enter__(self):
        _SEEN.append(("enter", self))
        return self

    def __exit__(self, kind, value, tb):
        _SEEN.append(("exit", self, kind))
        return False


@MODULE.disable
def _fail_when(flag):
    if flag:
        raise KeyError("after the break")


def _with_given_manager(x, manager, fail):
    with manager:
        y = x * 2
        print("inside the block")
        _fail_when(fail)
        y = y + 1
    return y


def _with_own_manager(x, fail):
    with _Recording() as manager:
        y = x.cos()
        print("inside the block")
        _fail_when(fail)
        y = y * manager.__class__.__name__.count("R")
    return y


def _events(events):
    return [(e[0], e[2] if len(e) > 2 else None) for e in events]


@pytest.mark.parametrize("fail", [False, True])
@pytest.mark.parametrize("own", [False, True], ids=["given", "own"])
def test_user_context_manager_exits_once_on_the_entered_object(own, fail):
    fn = _with_own_manager if own else _with_given_manager
    compiled = capture(fn)
    for _ in range(2):
        x = torch.randn(3)
        results, logs = [], []
        for f in (fn, compiled):
            _SEEN.clear()
            args = (x, fail) if own else (x, _Recording(), fail)
            try:
                results.append(f(*args))
            except KeyError as e:
                results.append(repr(e))
            logs.append(list(_SEEN))
            if not own:
                assert all(entry[1] is args[1] for entry in _SEEN)  # the very object passed in
        if isinstance(results[0], str):
            assert results[0] == results[1]
        else:
            torch.testing.assert_close(results[1], results[0])
        assert _events(logs[1]) == _events(logs[0])  # one enter, then one exit with the same error
        entered, exited = logs[1][0][1], logs[1][-1][1]
        assert entered is exited  # __exit__ runs on the object whose __enter__ ran
    assert compiled.break_count() >= 1 and compiled.stats.fallbacks == 0


def _three_deep_raise(y):
    y = y + 1
    print("deep")
    _fail_when(True)
    return y


def _catches_in_the_middle(y):
    try:
        return _three_deep_raise(y) * 2
    except KeyError:
        return y - 1


def _try_in_the_middle(x):
    return _catches_in_the_middle(x * 2) + 3


def test_exception_after_a_break_three_deep_is_caught_in_the_middle():
    compiled = capture(_try_in_the_middle)
    for _ in range(2):
        x = torch.randn(3)
        torch.testing.assert_close(compiled(x), _try_in_the_middle(x))
    assert compiled.stats.fallbacks == 0


def _closure_made_on_every_call(x):
    k = 2.0

    def scaled(t):
        return t * k

    y = scaled(x)
    print("break")
    k = 3.0  # written through the cell the closure reads
    return scaled(y) + k


def _captures(compiled):
    return compiled.stats.captures + sum(_captures(c) for c in compiled.children)


def test_cells_cross_a_break_and_new_closures_reuse_the_cache():
    compiled = capture(_closure_made_on_every_call)
    for _ in range(4):
        x = torch.randn(3)
        torch.testing.assert_close(compiled(x), _closure_made_on_every_call(x))
    # One capture of the function and one of its resume function: a closure made anew on
    # every call is guarded by its code and its cells, not by its identity.
    assert _captures(compiled) == 2 and compiled.stats.fallbacks == 0


def _cells_and_try(x, fail):
    k = 2.0

    def mul(t):
        return t * k

    try:
        y = mul(x)
        print("break in try")
        k = 5.0
        _fail_when(fail)  # raises after the break; the handler reads the cell
        y = mul(y)
    except KeyError:
        y = mul(y) - 1
    return y, k


def test_break_in_try_of_a_function_with_cells():
    compiled = capture(_cells_and_try)
    for fail in (False, True, False, True):
        x = torch.randn(3)
        (out, k), (ref, ref_k) = compiled(x, fail), _cells_and_try(x, fail)
        torch.testing.assert_close(out, ref)
        assert k == ref_k
    assert compiled.stats.fallbacks == 0 and compiled.break_count() >= 2


# A break inside a called function that first assigned a variable its own inner function closes
# over (Reformer's and ViLT's embeddings): the cell is the callee's, made again when the call runs
# for real, so the caller splits there instead of running eagerly.
def _callee_with_own_cell(x):
    scale = 1.0

    def scaled(t):
        return t * scale

    scale = 3.0  # a write to the callee's own cell
    y = scaled(x)
    return y + x.sum().item()  # the break, inside the callee


def _caller_of_own_cell(x):
    y = x.cos()
    return _callee_with_own_cell(y) * 2


# The same break after the callee wrote a cell of the caller's: running the callee again for
# real would see the caller's state changed twice, so the caller still runs eagerly.
def _caller_whose_cell_changes(x):
    count = 0

    def bump_then_break(t):
        nonlocal count
        count += 1
        return t + t.sum().item()

    y = bump_then_break(x.cos())
    return y * count


@pytest.mark.parametrize("fn,splits", [(_caller_of_own_cell, True), (_caller_whose_cell_changes, False)],
                         ids=["callee_cell", "caller_cell"])
def test_break_after_a_callee_wrote_a_cell(fn, splits):
    # split: the caller's graph, the callee run for real (itself split at its .item()), the rest
    _check_split_or_fallback(fn, splits)


def _check_split_or_fallback(fn, splits):
    """``fn`` matches eager over three calls, and its root frame splits once (``splits``) or runs eagerly."""
    compiled = capture(fn)
    for _ in range(3):
        x = torch.randn(3)
        torch.testing.assert_close(compiled(x), fn(x))
    root_breaks = sum(e.graph_break is not None for e in compiled.cache.entries)
    assert (root_breaks, compiled.stats.fallbacks) == ((1, 0) if splits else (0, 1))


# The same for lists, dicts, sets and objects: a callee that fills containers it made itself
# before its break (VITS's encoder appends to its own lists, its layer drop draws a random number)
# lets the caller split there; one that changed the caller's container still makes it run eagerly.
class _Box:
    def __init__(self, value):
        self.value = value


def _callee_filling_its_own_containers(x):
    outs = []
    outs.append(x.sin())
    named = {}
    named["cos"] = x.cos()
    seen = set()
    seen.add("cos")
    box = _Box(x)
    box.value = box.value * 2
    outs.extend([named["cos"], box.value])
    return sum(outs) + x.sum().item() * len(seen)


def _caller_of_own_containers(x):
    y = x.exp()
    kept = [y]
    return _callee_filling_its_own_containers(y) + kept[0]


def _callee_appending_then_breaking(acc, t):
    acc.append(t.sin())
    return t + t.sum().item()


def _caller_whose_list_changes(x):
    acc = [x]
    y = _callee_appending_then_breaking(acc, x.cos())
    return y * len(acc) + acc[-1]


def _callee_setting_then_breaking(box, t):
    box.value = t.sin()
    return t + t.sum().item()


def _caller_whose_object_changes(x):
    box = _Box(x)
    y = _callee_setting_then_breaking(box, x.cos())
    return y + box.value


def _callee_looping_with_own_state(hidden):
    states = ()
    cache = {}
    for i in range(3):
        states = states + (hidden,)
        cache[i] = hidden.mean()
        hidden = hidden.tanh() + cache[i]
    return hidden * (1.0 if hidden.sum().item() > -1e9 else 0.0), states


def _caller_unpacking_callee_results(x):
    hidden, states = _callee_looping_with_own_state(x.sin())
    return hidden + states[-1]


@pytest.mark.parametrize("fn,splits", [(_caller_of_own_containers, True), (_caller_unpacking_callee_results, True),
                                       (_caller_whose_list_changes, False), (_caller_whose_object_changes, False)],
                         ids=["callee_containers", "callee_loop_state", "caller_list", "caller_object"])
def test_break_after_a_callee_changed_containers(fn, splits):
    _check_split_or_fallback(fn, splits)


def _passes_on(x):
    y = x.sin() * 2
    print(end="")  # a graph break; the rest returns y as it is
    return y


def _passes_on_several(x, w):
    y = x @ w
    print(end="")
    return y, w, (x, y)


def _breaks_inside(t):
    u = t.cos()
    print(end="")
    return u + 1


def _wrapper_of_a_break(x):
    return _breaks_inside(x)  # the wrapper's resume function only passes the result on


def _nothing_computed(x):
    print(end="")
    return x


# (case, function, number of arguments, graphs with nodes)
PASS_ON = [("result", _passes_on, 1, 1), ("results and inputs", _passes_on_several, 2, 1),
           ("wrapper", _wrapper_of_a_break, 1, 2), ("no graph at all", _nothing_computed, 1, 0)]


@pytest.mark.parametrize("fn,arity,graphs", [c[1:] for c in PASS_ON], ids=[c[0] for c in PASS_ON])
@pytest.mark.parametrize("grad", [False, True])
def test_graphs_that_only_return_inputs_reach_no_backend(fn, arity, graphs, grad):
    compiled_graphs = []

    def backend(program, example_inputs):
        compiled_graphs.append(program)
        return lookup_backend("eager")(program, example_inputs)

    cf = capture(fn, backend=backend)
    for _ in range(2):
        args = [torch.randn(3, 3, requires_grad=grad) for _ in range(arity)]
        got, want = cf(*args), fn(*args)
        torch.testing.assert_close(got, want)
        if fn is _passes_on_several:
            assert got[1] is args[1] and got[2][0] is args[0]  # the inputs themselves, as eager returns
        if fn is _nothing_computed:
            assert got is args[0]
    assert all(p.graphs[p.entry].nodes for p in compiled_graphs)
    assert len(compiled_graphs) == graphs


# Comprehensions whose body breaks on each element (a tensor's data decides the value). On
# Python 3.12+ a comprehension runs inline in its function (PEP 709): after the break the list,
# set or dict being built is an input of the resumed code, and what the resumed graph adds to
# it must reach the real object.
def _list_of_ints(x):
    return [int(u) + 1 for u in x[:, 0].round().unique()]


def _list_of_selections(x):
    rows = x[:, 0].round().unique()
    picked = [x[x[:, 0].round() == u] for u in rows]
    return torch.cat(picked, 0) * 2, [p.size(0) for p in picked]


def _nested_lists(x):
    return [[int(v) for v in x[i, :2].round()] for i in range(x.size(0))]


def _set_and_dict(x):
    values = x[:, 0].round()
    return sorted({int(u) for u in values}), {int(u): x[values == u].sum() for u in values.unique()}


def _list_after_items(x):
    out = [x[0, 0] * 2]
    out += [x[i, 0] * float(x[i, 1].round()) for i in range(1, x.size(0))]
    return torch.stack(out)


@pytest.mark.parametrize("fn", [_list_of_ints, _list_of_selections, _nested_lists, _set_and_dict, _list_after_items])
def test_comprehension_that_breaks_on_every_element(fn):
    def make():
        x = torch.randn(6, 3) * 2
        x[:, 0] = torch.tensor([0.0, 1.0, 2.0, 1.0, 0.0, 2.0])[torch.randperm(6)]
        return (x,)

    compiled = capture(fn)
    for _ in range(3):
        (x,) = make()
        expected, actual = fn(x.clone()), compiled(x)
        assert repr(actual) == repr(expected)
