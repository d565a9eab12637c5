"""fireclay.compile against eager, over a table of functions, modules and backends."""

import pytest
import torch

import fireclay


def mlp_fn(x, w1, w2):
    return torch.nn.functional.gelu(x @ w1) @ w2


def norm_fn(x, w):
    return torch.nn.functional.layer_norm(x, x.shape[-1:], w) * 2 - x.mean()


def softmax_fn(x):
    return torch.softmax(x, dim=-1).cumsum(0)[1:]


def structured_fn(x, y):
    return {"sum": x + y, "pair": (x * y, y.relu())}


FUNCTIONS = [
    (mlp_fn, lambda: (torch.randn(5, 8), torch.randn(8, 16), torch.randn(16, 3))),
    (norm_fn, lambda: (torch.randn(4, 6), torch.randn(6))),
    (softmax_fn, lambda: (torch.randn(3, 7),)),
    (structured_fn, lambda: (torch.randn(2, 3), torch.randn(2, 3))),
]
BACKENDS = ["eager", "aot_eager", "fireclay"]


def _assert_close(actual, expected):
    flat_a, spec_a = torch.utils._pytree.tree_flatten(actual)
    flat_e, spec_e = torch.utils._pytree.tree_flatten(expected)
    assert spec_a == spec_e
    for a, e in zip(flat_a, flat_e):
        torch.testing.assert_close(a, e, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("fn, make_inputs", FUNCTIONS, ids=[f.__name__ for f, _ in FUNCTIONS])
def test_functions_match_eager(fn, make_inputs, backend):
    compiled = fireclay.compile(fn, backend=backend)
    for _ in range(2):  # a second call with fresh inputs runs from the cache
        inputs = make_inputs()
        _assert_close(compiled(*inputs), fn(*inputs))


@pytest.mark.parametrize("backend", BACKENDS)
def test_module_training_step_matches_eager(backend):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(6, 12), torch.nn.Tanh(), torch.nn.Linear(12, 2))
    reference = torch.nn.Sequential(torch.nn.Linear(6, 12), torch.nn.Tanh(), torch.nn.Linear(12, 2))
    reference.load_state_dict(model.state_dict())
    compiled = fireclay.compile(model, backend=backend)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    ref_opt = torch.optim.SGD(reference.parameters(), lr=0.1)
    for _ in range(3):
        x = torch.randn(4, 6)
        for m, o in ((compiled, opt), (reference, ref_opt)):
            o.zero_grad()
            m(x).pow(2).mean().backward()
            o.step()
    for (name, p), q in zip(model.named_parameters(), reference.parameters()):
        torch.testing.assert_close(p, q, msg=name)


def test_compiled_module_keeps_the_module_surface():
    model = torch.nn.Linear(3, 2)
    compiled = fireclay.compile(model, backend="eager")
    assert compiled.weight is model.weight
    assert list(compiled.state_dict()) == ["weight", "bias"]
    assert [p for p in compiled.parameters()] == [model.weight, model.bias]
    fresh = torch.nn.Linear(3, 2)
    compiled.load_state_dict(fresh.state_dict())
    torch.testing.assert_close(model.weight, fresh.weight)


def test_decorator_forms():
    @fireclay.compile
    def bare(x):
        return x.sin()

    @fireclay.compile(backend="eager", fullgraph=True)
    def configured(x):
        return x.cos()

    x = torch.randn(5)
    torch.testing.assert_close(bare.__wrapped__(x) if hasattr(bare, "__wrapped__") else x.sin(), x.sin())
    torch.testing.assert_close(configured(x), x.cos())
    assert configured.__name__ == "configured"


def test_disable_returns_the_model_itself():
    def f(x):
        return x

    assert fireclay.compile(f, disable=True) is f


def test_unknown_backend_names_the_available_ones():
    with pytest.raises(fireclay.BackendNotFound, match="available: .*aot_eager"):
        fireclay.compile(lambda x: x, backend="no-such-backend")


def test_mode_and_options_conflict_and_unknowns():
    assert fireclay.list_mode_options("reduce-overhead")["cudagraphs"] is True
    assert set(fireclay.list_modes()) == {"default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs"}
    with pytest.raises(ValueError, match="not both"):
        fireclay.compile(lambda x: x, mode="max-autotune", options={"max_autotune": False})
    with pytest.raises(ValueError, match="unknown mode"):
        fireclay.compile(lambda x: x, mode="fastest")
    with pytest.raises(ValueError, match="unknown compile option"):
        fireclay.compile(lambda x: x, options={"turbo": True})


def test_registered_backend_receives_the_program_and_options():
    seen = {}

    def counting(program, example_inputs, options=None):
        seen["ops"] = [n.op for n in program.main.nodes]
        seen["options"] = options
        return lambda *inputs: [inputs[0] * 2]

    fireclay.register_backend("counting-test", counting)
    assert "counting-test" in fireclay.list_backends()
    out = fireclay.compile(lambda x: x * 2, backend="counting-test", mode="max-autotune")(torch.ones(3))
    torch.testing.assert_close(out, torch.full((3,), 2.0))
    assert seen["ops"] and seen["options"]["max_autotune"] is True


def test_torch_compile_reaches_fireclay_through_the_entry_point():
    model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.ReLU())
    compiled = torch.compile(model, backend="fireclay_aot_eager")
    x = torch.randn(2, 4)
    torch.testing.assert_close(compiled(x), model(x))


def _broken_backend(program, example_inputs):
    raise RuntimeError("this backend cannot compile anything")


def test_backend_failure_falls_back_to_eager_and_says_why(caplog):
    compiled = fireclay.compile(mlp_fn, backend=_broken_backend)
    inputs = FUNCTIONS[0][1]()
    with caplog.at_level("WARNING", logger="fireclay"):
        _assert_close(compiled(*inputs), mlp_fn(*inputs))
    assert "cannot compile anything" in caplog.text and "test_compile.py" in caplog.text


def test_backend_failure_raises_under_fullgraph():
    from fireclay.verify import BackendCompilerFailed

    compiled = fireclay.compile(mlp_fn, backend=_broken_backend, fullgraph=True)
    with pytest.raises(BackendCompilerFailed, match=r"test_compile.py:\d+: RuntimeError: this backend"):
        compiled(*FUNCTIONS[0][1]())


def test_reset_makes_compiled_functions_capture_again():
    captures = []

    def counting(program, example_inputs):
        captures.append(program)
        return lambda *inputs: [inputs[0] + 1]

    compiled = fireclay.compile(lambda x: x + 1, backend=counting)
    x = torch.zeros(2)
    compiled(x)
    compiled(x)
    assert len(captures) == 1
    fireclay.reset()
    torch.testing.assert_close(compiled(x), x + 1)
    assert len(captures) == 2


def test_graph_breaks_are_explained_and_still_match_eager():
    def with_print(x):
        y = x.sin()
        print("between the graphs")
        return y.cos()

    report = fireclay.explain(with_print)(torch.randn(3))
    assert report.graph_count == 2 and report.break_count == 1
    assert "print" in str(report)
    x = torch.randn(3)
    torch.testing.assert_close(fireclay.compile(with_print, backend="fireclay")(x), x.sin().cos())
