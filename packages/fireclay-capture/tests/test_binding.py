"""The binder of a captured function's arguments agrees with ``inspect``'s bind + apply_defaults
over a table of signatures and calls, raises where a call of the function raises, and follows
defaults reassigned after it was made."""

from __future__ import annotations

import inspect

import pytest
import torch

from fireclay_capture import capture
from fireclay_capture.binding import argument_binder


def positional(a, b, c=3):
    pass


def star_args(a, *rest, key=None):
    pass


def keyword_only(a, *, b, c=2, **extra):
    pass


def positional_only(a, b=1, /, c=2, *args, d, **kw):
    pass


def defaults_only(x=None, y=(), z="z"):
    pass


SIGNATURES = [
    (positional, [((1, 2), {}), ((1,), {"b": 2}), ((1, 2, 4), {}), ((), {"a": 1, "b": 2, "c": 5})]),
    (star_args, [((1,), {}), ((1, 2, 3), {"key": 4})]),
    (keyword_only, [((1,), {"b": 2}), ((1,), {"b": 2, "c": 3, "other": 4})]),
    (positional_only, [((1,), {"d": 4}), ((1, 2, 3, 4, 5), {"d": 6, "e": 7})]),
    (defaults_only, [((), {}), ((1,), {"z": "w"})]),
]
CALLS = [(fn, args, kwargs) for fn, calls in SIGNATURES for args, kwargs in calls]


@pytest.mark.parametrize("fn,args,kwargs", CALLS, ids=[f"{c[0].__name__}-{i}" for i, c in enumerate(CALLS)])
def test_binding_agrees_with_inspect(fn, args, kwargs):
    bound = inspect.signature(fn).bind(*args, **kwargs)
    bound.apply_defaults()
    got = argument_binder(fn)(args, kwargs)
    assert got == dict(bound.arguments) and list(got) == list(bound.arguments)


@pytest.mark.parametrize("fn,args,kwargs", [
    (positional, (), {}), (positional, (1, 2, 3, 4), {}), (keyword_only, (1,), {}),
    (positional_only, (1,), {"c": 1}), (star_args, (1,), {"other": 2}),
])
def test_a_call_that_does_not_bind_raises_as_the_function_does(fn, args, kwargs):
    with pytest.raises(TypeError) as expected:
        fn(*args, **kwargs)
    with pytest.raises(TypeError) as got:
        argument_binder(fn)(args, kwargs)
    assert str(got.value) == str(expected.value)


def test_reassigned_defaults_are_followed():
    def f(a, b=1, *, c=2):
        pass

    bind = argument_binder(f)
    assert bind((0,), {}) == {"a": 0, "b": 1, "c": 2}
    f.__defaults__ = (10,)
    f.__kwdefaults__ = {"c": 20}
    assert bind((0,), {}) == {"a": 0, "b": 10, "c": 20}


def test_captured_function_with_keywords_binds_defaults():
    def f(x, scale=2.0, *, shift=None, **extra):
        y = x * scale
        return y if shift is None else y + shift

    cf = capture(f, fullgraph=True)
    x = torch.randn(3)
    torch.testing.assert_close(cf(x), f(x))
    torch.testing.assert_close(cf(x, shift=1.0), f(x, shift=1.0))
    torch.testing.assert_close(cf(x, 3.0, shift=1.0, unused=4), f(x, 3.0, shift=1.0, unused=4))
    f.__defaults__ = (5.0,)
    torch.testing.assert_close(cf(x), f(x))
