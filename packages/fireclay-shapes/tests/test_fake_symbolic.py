"""Fake tensors with symbolic sizes: torch's meta kernels compute with our symbols.

For every case of the op table, the symbolic output sizes and strides, evaluated at the trace's
sizes, equal eager's; evaluated at other sizes that satisfy the recorded guards, they equal
eager's results at those sizes.
"""

import pytest

torch = pytest.importorskip("torch")

import sympy  # noqa: E402
from optable import CASES  # noqa: E402

from fireclay_shapes import ShapeEnv  # noqa: E402
from fireclay_shapes.torch import FakeMode, FakeTensor, expr_of, make_symint  # noqa: E402

DYNAMIC = [c for c in CASES if any(c.dynamic)]


def flat(out):
    if isinstance(out, (tuple, list)):
        return [t for o in out for t in flat(o)]
    return [out]


def trace(case):
    env = ShapeEnv()
    mode = FakeMode(env)
    torch.manual_seed(0)
    real = case.inputs(case.sizes)
    fakes = []
    params: dict[str, sympy.Symbol] = {}
    for i, (t, dims) in enumerate(zip(real, case.dynamic)):
        f = mode.from_real(t, dynamic_dims=list(dims), sources=[f"L['in{i}'].size()[{d}]" for d in range(t.dim())])
        for d, name in dims.items():
            e = expr_of(f.shape[d])
            assert isinstance(e, sympy.Symbol), (name, e)
            params[name] = e
        fakes.append(f)
    with mode:
        out = flat(case.fn(*fakes))
    return env, params, out


def concrete(dim, values):
    e = expr_of(dim).xreplace({s: sympy.Integer(v) for s, v in values.items()})
    assert e.is_Integer, e
    return int(e)


def layout(t, values):
    return ([concrete(s, values) for s in t.shape], [concrete(s, values) for s in t.stride()], t.dtype)


@pytest.mark.parametrize("case", DYNAMIC, ids=[c.name for c in DYNAMIC])
def test_symbolic_shapes_match_eager_at_hints_and_other_sizes(case):
    env, params, out = trace(case)
    hints = {params[n]: v for n, v in case.sizes.items() if n in params}
    eager = flat(case.fn(*case.inputs(case.sizes)))
    assert [layout(t, hints) for t in out] == [(list(e.shape), list(e.stride()), e.dtype) for e in eager]
    assert env.check({s.name: v for s, v in hints.items()})
    for sizes in case.other_sizes:
        values = {params[n]: v for n, v in sizes.items() if n in params}
        eager = flat(case.fn(*case.inputs(sizes)))
        want = [(list(e.shape), list(e.stride()), e.dtype) for e in eager]
        if env.check({s.name: v for s, v in values.items()}):
            assert [layout(t, values) for t in out] == want, (sizes, env.guards.dumps())


def test_decisions_in_meta_kernels_become_guards():
    env = ShapeEnv()
    mode = FakeMode(env)
    x = mode.from_real(torch.randn(8), dynamic_dims=[0], sources=["L['x'].size()[0]"])
    with mode:
        y = x.view(-1, 4)
    assert str(y.shape[0]) == "FloorDiv(s0, 4)"
    guard = env.render_guards()

    def accepts(n):
        class T:
            def size(self):
                return (n,)

        return eval(guard, {"__builtins__": {}}, {"L": {"x": T()}})

    for n in range(2, 40):
        view_ok = n % 4 == 0
        # the guards must reject every size the view would fail at (and the trace's own size passes)
        if not view_ok:
            assert not accepts(n), (n, guard)
    assert accepts(8) and accepts(12)


def test_broadcasting_two_symbols_guards_their_relation():
    env = ShapeEnv()
    mode = FakeMode(env)
    a = mode.from_real(torch.randn(5, 1), dynamic_dims=[0])
    b = mode.from_real(torch.randn(5), dynamic_dims=[0], )
    with mode:
        out = a + b
    assert [str(s) for s in out.shape] == ["s0", "s0"]  # duck sizing made them one symbol
    env2 = ShapeEnv(duck_sizing=False)
    mode2 = FakeMode(env2)
    c = mode2.from_real(torch.randn(6), dynamic_dims=[0])
    d = mode2.from_real(torch.randn(6), dynamic_dims=[0])
    with mode2:
        out2 = c + d
    assert str(out2.shape[0]) in ("s0", "s1")
    assert env2.guards.dumps() == ["s0 == s1"]


def test_symint_arithmetic_in_user_code_is_symbolic():
    env = ShapeEnv()
    n = make_symint(env, env.create_symbol(6, "n"))
    assert isinstance(n, torch.SymInt)
    m = (n * 2 + 1) // 2
    assert str(m) == "s0"  # (2*s0 + 1) // 2 == s0 exactly
    assert str(torch.sym_max(n, 3)) == "Max(3, s0)"
    assert len(env.guards) == 0
    assert n > 4  # a decision: guarded
    assert env.guards.dumps() == ["s0 > 4"]
    assert int(n) == 6
    assert env.guards.dumps() == ["s0 > 4", "s0 == 6"]


def test_symbolic_fake_metadata_reads_like_torch():
    env = ShapeEnv()
    mode = FakeMode(env)
    x = mode.from_real(torch.randn(4, 6).t(), dynamic_dims=[0, 1])
    assert isinstance(x, FakeTensor)
    assert [str(s) for s in x.shape] == ["s0", "s1"]
    assert [str(s) for s in x.stride()] == ["1", "s0"]


def test_fakes_from_program_metadata():
    env = ShapeEnv.restore([{"name": "s0", "hint": 8, "min": 2, "max": None},
                            {"name": "s1", "hint": 3, "min": 2, "max": None}], ["s1 < s0"])
    mode = FakeMode(env)
    x = mode.fake(["s0", "2*s1"], dtype="float16", device="cuda:0")
    w = mode.fake(["2*s1", 5], strides=[1, "2*s1"], dtype=torch.float16, device="cuda:0")
    assert [str(d) for d in x.shape] == ["s0", "2*s1"] and [str(d) for d in x.stride()] == ["2*s1", "1"]
    assert x.device == torch.device("cuda", 0) and x.dtype == torch.float16 and not x.requires_grad
    with mode:
        y = x @ w
    assert [str(d) for d in y.shape] == ["s0", "5"] and y.device == x.device
    with pytest.raises(Exception, match="does not have"):
        mode.fake(["s7"])
