"""``raise`` and ``try``/``except``/``finally`` inside captured code: an exception raised and
caught within the trace (here or in an inlined call) follows the code's exception table, as
CPython runs it, and stays in one graph; one that escapes still runs eagerly and raises as
eager does."""

from __future__ import annotations

import collections.abc

import pytest
import torch

from fireclay_capture import capture, explain, graph_break


class Registry(collections.abc.MutableMapping):
    """transformers' GeneralInterface in miniature: a class-wide mapping and a local one, whose
    ``__getitem__`` raises KeyError for a missing key (``Mapping.get`` catches it)."""

    _global = {"sdpa": torch.sigmoid}

    def __init__(self):
        self._local = {}

    def __getitem__(self, key):
        if key in self._local:
            return self._local[key]
        return self._global[key]

    def __setitem__(self, key, value):
        self._local[key] = value

    def __delitem__(self, key):
        del self._local[key]

    def __iter__(self):
        return iter({**self._global, **self._local})

    def __len__(self):
        return len(self._global.keys() | self._local.keys())


REGISTRY = Registry()
TABLE = {"a": 1.5}


class MyError(ValueError):
    pass


def registry_get_missing(x):
    fn = REGISTRY.get("eager", torch.tanh)
    return fn(x) * 2


def registry_get_present(x):
    return REGISTRY.get("sdpa", torch.tanh)(x) + 1


def dict_key_error(x):
    try:
        scale = TABLE["b"]
    except KeyError:
        scale = 3.0
    return x * scale


def raise_and_catch_by_name(x):
    y = x + 1
    try:
        raise ValueError("boom")
    except ValueError as e:
        y = y * len(str(e))
    return y


def exception_args(x):
    try:
        raise MyError(2, "two")
    except ValueError as e:
        return x * e.args[0]


def caught_two_calls_deep(x):
    def inner(d):
        return d["missing"]

    def middle(d):
        return inner(d) + 1

    try:
        return x * middle({"present": 1})
    except KeyError as e:
        return x - len(e.args)


def tuple_of_classes(x):
    try:
        [1, 2][5]
    except (KeyError, IndexError):
        return x.cos()
    return x.sin()


def nested_try_outer_matches(x):
    try:
        try:
            {}["k"]
        except IndexError:
            return x * 0
    except LookupError:
        return x * 7
    return x


def bare_reraise(x):
    try:
        try:
            raise MyError("inner")
        except MyError:
            x = x + 1
            raise
    except ValueError:
        x = x * 3
    return x


def raise_from(x):
    try:
        try:
            {}["k"]
        except KeyError as e:
            raise RuntimeError("wrapped") from e
    except RuntimeError as e:
        return x * (2 if isinstance(e.__cause__, KeyError) else 5)


def finally_runs(x):
    out = []
    try:
        out.append(x * 2)
        {}["k"]
    except KeyError:
        out.append(x + 1)
    finally:
        out.append(x - 1)
    return torch.stack(out)


def else_clause(x):
    try:
        y = x * 2
    except KeyError:
        y = x * 3
    else:
        y = y + 10
    return y


def with_block_left_by_an_exception(x):
    w = x * 1
    try:
        with torch.no_grad():
            raise KeyError("k")
    except KeyError:
        pass
    return w * 2  # grad mode is back on: the output requires grad as in eager


def getattr_of_constant(x):
    try:
        n = (3).missing_attribute
    except AttributeError:
        n = 4
    return x * n


def exception_type_check(x):
    try:
        raise MyError("x")
    except Exception as e:
        return x * (1 if type(e) is MyError else 2)


def subscript_none_caught(x, mask=None):
    # transformers' compile path may subscript a mask it left None: the TypeError is the user's.
    try:
        return x + mask[0]
    except TypeError:
        return x * 2


def index_error_of_a_constant_caught(x):
    sizes = (2, 3)
    try:
        extra = sizes[5]
    except IndexError:
        extra = 1
    return x * extra


def iterate_none_caught(x, items=None):
    total = x
    try:
        for item in items:
            total = total + item
    except TypeError:
        total = total - 1
    return total


def subscript_none_in_a_callee_caught(x):
    def first(values):
        return values[0]

    try:
        return x + first(None)
    except TypeError:
        return x.cos()


CAUGHT = [registry_get_missing, registry_get_present, dict_key_error, raise_and_catch_by_name,
          exception_args, caught_two_calls_deep, tuple_of_classes, nested_try_outer_matches, bare_reraise,
          raise_from, finally_runs, else_clause, with_block_left_by_an_exception, getattr_of_constant,
          exception_type_check, subscript_none_caught, index_error_of_a_constant_caught, iterate_none_caught,
          subscript_none_in_a_callee_caught]


@pytest.mark.parametrize("fn", CAUGHT, ids=lambda f: f.__name__)
def test_an_exception_caught_inside_the_trace_stays_in_one_graph(fn):
    compiled = capture(fn, fullgraph=True)
    for _ in range(2):
        x = torch.randn(4, requires_grad=True)
        expected = fn(x)
        actual = compiled(x)
        torch.testing.assert_close(actual, expected)
        assert actual.requires_grad == expected.requires_grad
    assert compiled.stats.captures == 1
    e = explain(fn)(torch.randn(4))
    assert (e.graph_count, e.break_count) == (1, 0)


def escapes(x):
    y = x * 2
    raise MyError(f"bad size {y.shape[0]}")


def escapes_from_handler(x):
    try:
        {}["k"]
    except KeyError:
        raise MyError("no key") from None


def not_matched(x):
    try:
        {}["k"]
    except IndexError:
        return x
    return x * 2


def subscript_none_escapes(x, mask=None):
    y = x.sin()
    return y + mask[0]


def subscript_none_escapes_from_a_callee(x):
    def first(values):
        return values[0]

    return x.sin() + first(None)


@pytest.mark.parametrize("fn", [escapes, escapes_from_handler, not_matched, subscript_none_escapes,
                                subscript_none_escapes_from_a_callee], ids=lambda f: f.__name__)
def test_an_exception_that_escapes_raises_as_in_eager(fn, caplog):
    x = torch.randn(3)
    with pytest.raises(Exception) as eager:
        fn(x)
    with pytest.raises(eager.type) as compiled:
        capture(fn)(x)
    assert str(compiled.value) == str(eager.value)
    # The user's own exception, said as such: never an internal error of the capture.
    assert "internal error" not in caplog.text


class Holder:
    pass


def test_an_attribute_the_capture_cannot_see_is_not_treated_as_missing():
    # A tensor may carry attributes of its own: the trace must not take the `except` path.
    def fn(x):
        try:
            scale = x.scale
        except AttributeError:
            scale = 1.0
        return x * scale

    x = torch.randn(3)
    x.scale = 4.0
    torch.testing.assert_close(capture(fn)(x), fn(x))


def test_a_graph_break_inside_an_except_block_keeps_the_result():
    def fn(x):
        y = x + 1
        try:
            {}["k"]
        except KeyError:
            graph_break()
            y = y * 2
        return y * 3

    x = torch.randn(3)
    torch.testing.assert_close(capture(fn)(x), fn(x))
