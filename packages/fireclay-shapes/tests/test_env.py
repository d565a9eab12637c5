"""ShapeEnv: symbols, duck sizing, 0/1 specialisation, decisions and guards, unbacked sizes."""

import pytest
import sympy

from fireclay_shapes import (
    DataDependentError,
    GuardViolation,
    ShapeEnv,
    ShapeError,
    SymbolicBool,
    SymbolicInt,
    dumps,
    parse,
    sym_max,
    sym_min,
)


def test_duck_sizing_shares_symbols_for_equal_hints():
    env = ShapeEnv()
    a = env.create_symbol(8, "a")
    b = env.create_symbol(8, "b")
    c = env.create_symbol(5, "c")
    assert a == b and a != c
    assert env.symbols[str(a)].sources == ["a", "b"]
    assert "b == a" in env.render_guards()


def test_duck_sizing_can_be_turned_off():
    env = ShapeEnv(duck_sizing=False)
    assert env.create_symbol(8) != env.create_symbol(8)
    env = ShapeEnv()
    assert env.create_symbol(8) != env.create_symbol(8, duck=False)


@pytest.mark.parametrize("hint", [0, 1])
def test_zero_and_one_are_specialised(hint):
    env = ShapeEnv()
    assert env.create_symbol(hint, "x") == hint
    assert env.render_guards() == f"x == {hint}"
    env = ShapeEnv(specialize_zero_one=False)
    s = env.create_symbol(hint, "x")
    assert isinstance(s, sympy.Symbol)
    assert env.range_of(s).lo == 0


def test_dynamic_sizes_range_from_two():
    env = ShapeEnv()
    s = env.create_symint(7, "x")
    assert s.static_value() is None
    assert bool(s >= 2) and bool(s != 1) and bool(s != 0)
    assert len(env.guards) == 0


def test_mark_dynamic_bounds():
    env = ShapeEnv()
    s = env.create_symint(10, "x", min=4, max=64)
    assert bool(s <= 64) and bool(s > 3)
    assert len(env.guards) == 0
    assert env.render_guards() == "x >= 4 and x <= 64"
    # bounded sizes never duck-size with others
    assert env.create_symbol(10, "y") != s.expr
    with pytest.raises(ShapeError, match="outside its declared range"):
        env.create_symbol(100, "z", min=4, max=64)


def test_static_sizes_stay_ints():
    env = ShapeEnv()
    assert env.create_symint(12, "x", dynamic=False) == 12
    assert isinstance(env.create_symint(12, "x", dynamic=False), int)


def test_arithmetic_builds_expressions_and_folds_constants():
    env = ShapeEnv()
    s = env.create_symint(6, "x")
    t = env.create_symint(4, "y")
    assert isinstance(s * t + 1, SymbolicInt)
    assert str(s * t + 1) == "s0*s1 + 1"
    assert (s * t + 1).hint == 25
    assert (2 * s) // 2 == s.expr or str((2 * s) // 2) == "s0"
    assert (2 * s + 1) % 2 == 1 and isinstance((2 * s + 1) % 2, int)
    assert str(sym_max(s, t)) == "Max(s0, s1)" and sym_max(s, t).hint == 6
    assert sym_min(s, 100).hint == 6
    assert isinstance(s < t, SymbolicBool)
    assert len(env.guards) == 0


def test_bool_records_a_guard_once():
    env = ShapeEnv()
    s = env.create_symint(6, "x")
    t = env.create_symint(4, "y")
    assert bool(s > t) is True
    assert env.guards.dumps() == ["s1 < s0"]
    assert bool(t < s) is True and bool(s >= t) is True and bool(s == t) is False
    assert env.guards.dumps() == ["s1 < s0"]


def test_false_decisions_guard_the_negation():
    env = ShapeEnv()
    s = env.create_symint(6, "x")
    if s * 2 > 20:
        pytest.fail("hint says 12 > 20 is false")
    assert env.guards.dumps() == ["2*s0 <= 20"]
    assert bool(s < 11) is True  # implied by 2*s0 <= 20 through the narrowed range
    assert len(env.guards) == 1


def test_int_specialises_with_an_equality_guard():
    env = ShapeEnv()
    s = env.create_symint(6, "x")
    assert int(s + 1) == 7
    assert env.guards.dumps() == ["s0 + 1 == 7"]
    assert env.static_value(s) == 6
    assert list(range(s)) == list(range(6))


def test_equalities_become_replacements():
    env = ShapeEnv()
    s = env.create_symint(6, "x")
    t = env.create_symint(7, "y")
    assert bool(s + 1 == t)
    assert env.simplify(t.expr) == s.expr + 1
    assert env.static_value(t - s) == 1
    assert env.guards.dumps() == ["s1 == s0 + 1"]


def test_symbolic_values_are_unhashable():
    env = ShapeEnv()
    with pytest.raises(TypeError):
        hash(env.create_symint(6))


def test_unbacked_symbols_raise_on_decisions():
    env = ShapeEnv()
    u = env.wrap(env.create_unbacked_symbol())
    assert bool(u >= 0)  # known from the range: no hint needed
    with pytest.raises(DataDependentError) as err:
        bool(u > 4)
    msg = str(err.value)
    assert "u0 > 4" in msg.replace("4 < u0", "u0 > 4") and "data-dependent" in msg and "assume" in msg
    with pytest.raises(DataDependentError):
        int(u * 2)


def test_assume_on_unbacked_becomes_a_runtime_assert():
    env = ShapeEnv()
    u = env.create_unbacked_symbol()
    env.assume(sympy.Gt(u, 4))
    assert bool(env.wrap(u) > 2)
    assert env.runtime_asserts.dumps() == ["u0 > 4"]
    assert len(env.guards) == 0
    with pytest.raises(GuardViolation):
        env.assume(sympy.Lt(u, 3))


def test_assume_on_backed_checks_the_hint():
    env = ShapeEnv()
    s = env.create_symbol(5)
    env.assume(sympy.Lt(s, 8))
    assert env.guards.dumps() == ["s0 < 8"]
    with pytest.raises(GuardViolation, match="false for the current sizes"):
        env.assume(sympy.Gt(s, 6))


def test_render_guards_is_one_python_expression_over_sources():
    env = ShapeEnv()
    x0 = env.create_symint(8, "L['x'].size()[0]")
    y0 = env.create_symint(8, "L['y'].size()[0]")
    x1 = env.create_symint(3, "L['x'].size()[1]")
    env.create_symint(1, "L['x'].size()[2]")
    assert bool(x0 * x1 > 20)
    assert bool(y0 % 4 == 0)
    text = env.render_guards()

    class T:
        def __init__(self, *sizes):
            self.sizes = sizes

        def size(self):
            return self.sizes

    def check(x, y):
        return eval(text, {"__builtins__": {}}, {"L": {"x": T(*x), "y": T(*y)}})

    assert check((8, 3, 1), (8,))
    assert check((12, 2, 1), (12,))
    assert not check((8, 3, 2), (8,))       # specialised 1
    assert not check((8, 3, 1), (12,))      # duck sizing
    assert not check((6, 3, 1), (6,))       # 8 * 3 > 20, 6 % 4 == 0 fails
    assert not check((8, 1, 1), (8,))       # dynamic sizes are >= 2
    assert check((20, 3, 1), (20,))
    assert not check((10, 3, 1), (10,))     # 10 % 4 != 0
    assert text.count("and") >= 4


def test_check_evaluates_on_symbol_values():
    env = ShapeEnv()
    a = env.create_symint(8, "a")
    b = env.create_symint(3, "b")
    assert bool(a > b)
    assert env.check({"s0": 8, "s1": 3})
    assert not env.check({"s0": 3, "s1": 8})
    assert not env.check({"s0": 1, "s1": 0})


def test_guard_strings_round_trip():
    env = ShapeEnv()
    a = env.create_symint(8, "a")
    b = env.create_symint(3, "b")
    bool(a // b == 2)
    bool(sym_max(a, b * 4) > 10)
    for text in env.guards.dumps():
        assert dumps(parse(text)) == text


def test_guard_set_drops_implied_guards():
    env = ShapeEnv()
    s = env.create_symint(5, "x")
    assert bool(s < 20) and bool(s < 10)
    assert env.guards.dumps() == ["s0 < 20", "s0 < 10"]
    assert env.produce_guards().dumps() == ["s0 < 10"]


def test_symbols_from_two_envs_do_not_mix():
    a = ShapeEnv().create_symint(4)
    b = ShapeEnv().create_symint(4)
    with pytest.raises(ShapeError, match="two different ShapeEnvs"):
        a + b


def test_symbol_records_and_restore_round_trip():
    env = ShapeEnv()
    a = env.create_symint(8, "a")
    b = env.create_symint(5, "b", min=2, max=64)
    u = env.create_unbacked_symbol()
    assert bool(a > b)
    records = env.symbol_records()
    assert records == [{"name": "s0", "hint": 8, "min": 2, "max": None},
                       {"name": "s1", "hint": 5, "min": 2, "max": 64},
                       {"name": "u0", "hint": None, "min": 0, "max": None}]
    again = ShapeEnv.restore(records, env.produce_guards().dumps())
    assert again.symbol_records() == records
    assert again.guards.dumps() == ["s1 < s0"]
    assert again.static_value(sympy.Gt(a.expr, b.expr)) is True  # the guard is a known fact
    assert again.check({"s0": 9, "s1": 3}) and not again.check({"s0": 3, "s1": 9})
    assert str(again.create_symbol(9)) == "s2" and str(again.create_unbacked_symbol()) == "u1"
    assert str(u) == "u0"
