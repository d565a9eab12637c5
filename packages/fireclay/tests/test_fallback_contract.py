"""The fallback contract: a failure inside any stage of fireclay never reaches the caller unless
``fullgraph=True``. Each case makes one stage's entry raise; the compiled call must still give
eager's result, with exactly one warning naming the stage (however often it is called), and
raise under ``fullgraph=True``. An error of the user's own code still propagates as in eager."""

from __future__ import annotations

import importlib
import logging

import pytest
import torch

import fireclay
import fireclay_autograd.api
import fireclay_autograd.joint
import fireclay_cpp
from fireclay.backends import builtin
from fireclay_autograd.functionalize import ViewStep
from fireclay_capture.interpreter import frame as frame_module
from fireclay_ir.stages import NOTICES


class InjectedFailure(RuntimeError):
    pass


def _raise(*args, **kwargs):
    raise InjectedFailure("injected for the test")


def _returns_failing_callable(*args, **kwargs):
    def run(*inputs):
        raise IndexError("tuple index out of range")

    return run


def _failing_view(self, x, symbols=None):
    raise IndexError("tuple index out of range")


def _breaks_capture(frame, inst):
    raise InjectedFailure("injected for the test")


# (stage named in the warning, what to patch, attribute, replacement, path: inference or training)
CASES = [
    ("capture", frame_module.HANDLERS, "BINARY_OP", _breaks_capture, "inference"),
    ("aten tracing", fireclay_autograd.joint, "_run", _raise, "inference"),
    ("aten tracing", fireclay_autograd.joint, "_run", _raise, "training"),
    ("functionalization", fireclay_autograd.joint, "functionalize", _raise, "inference"),
    ("functionalization", fireclay_autograd.joint, "functionalize", _raise, "training"),
    ("partitioning", fireclay_autograd.api, "partition", _raise, "training"),
    ("lowering", builtin, "scheduled_program", _raise, "inference"),
    ("lowering", builtin, "scheduled_program", _raise, "training"),
    ("code generation", fireclay_cpp, "compile_program", _raise, "inference"),
    ("generated code", fireclay_cpp, "compile_program", _returns_failing_callable, "inference"),
    ("generated code", fireclay_cpp, "compile_program", _returns_failing_callable, "training"),
    ("runtime plan", ViewStep, "apply", _failing_view, "inference"),
    ("runtime plan", ViewStep, "apply", _failing_view, "training"),
]


class Block(torch.nn.Module):
    """A small layer whose outputs include a view of another output (the runtime plan rebuilds
    it) and whose parameters require grad (the training path partitions)."""

    def __init__(self):
        super().__init__()
        self.linear = torch.nn.Linear(6, 6)

    def forward(self, x):
        y = torch.relu(self.linear(x)) * 2 + 1
        return y, y.t()


def _fresh(seed: int = 0) -> Block:
    torch.manual_seed(seed)
    return Block()


@pytest.fixture(autouse=True)
def _isolated(monkeypatch):
    monkeypatch.setattr(fireclay.config, "compile_cache", False)  # every stage must run
    NOTICES.clear()
    yield
    NOTICES.clear()


def _warnings(caplog) -> list[str]:
    # A stage package's record is forwarded to its fireclay.<stage> logger: count each message once.
    return list(dict.fromkeys(r.getMessage() for r in caplog.records
                              if r.levelno == logging.WARNING and r.name.startswith("fireclay")))


def _set(target, name, value, monkeypatch):
    if isinstance(target, dict):
        monkeypatch.setitem(target, name, value)
    else:
        monkeypatch.setattr(target, name, value)


def _step(model, x, path):
    """Outputs (inference) or outputs and gradients (training) of one call."""
    if path == "inference":
        with torch.no_grad():
            return [t.clone() for t in model(x)]
    y, yt = model(x)
    (y.sum() + yt[0].sum()).backward()
    return [y.detach(), yt.detach(), *[p.grad.clone() for p in model.parameters()]]


@pytest.mark.parametrize(("stage", "target", "name", "replacement", "path"), CASES,
                         ids=[f"{c[0]}-{c[4]}" for c in CASES])
def test_a_failing_stage_falls_back_with_one_warning(stage, target, name, replacement, path, monkeypatch, caplog):
    x = torch.randn(4, 6)
    expected = _step(_fresh(), x, path)
    _set(target, name, replacement, monkeypatch)
    model = _fresh()
    compiled = fireclay.compile(model)
    caplog.set_level(logging.INFO)
    for _ in range(3):
        for p in model.parameters():
            p.grad = None
        actual = _step(compiled, x, path)
        assert len(actual) == len(expected)
        for a, e in zip(actual, expected):
            torch.testing.assert_close(a, e)
    warned = _warnings(caplog)
    assert len(warned) == 1, warned
    assert stage in warned[0], warned[0]
    assert "test_fallback_contract.py" in warned[0], warned[0]  # names the user's code


@pytest.mark.parametrize(("stage", "target", "name", "replacement", "path"), CASES,
                         ids=[f"{c[0]}-{c[4]}" for c in CASES])
def test_a_failing_stage_raises_under_fullgraph(stage, target, name, replacement, path, monkeypatch):
    _set(target, name, replacement, monkeypatch)
    compiled = fireclay.compile(_fresh(), fullgraph=True)
    with pytest.raises((fireclay.BackendCompilerFailed, InjectedFailure, IndexError)) as raised:
        _step(compiled, torch.randn(4, 6), path)
    if isinstance(raised.value, fireclay.BackendCompilerFailed):
        assert raised.value.stage == stage
        assert "test_fallback_contract.py" in str(raised.value)


def test_the_users_own_error_propagates_as_in_eager(monkeypatch, caplog):
    """The generated code fails, and so does eager (an index out of range): eager's error is the
    one the caller sees, and nothing is reported as fireclay's failure."""
    monkeypatch.setattr(fireclay_cpp, "compile_program", _returns_failing_callable)
    table = torch.randn(5, 3)

    def lookup(ids):
        return torch.nn.functional.embedding(ids, table) * 2

    caplog.set_level(logging.WARNING)
    with pytest.raises(IndexError, match="index out of range in self"):
        lookup(torch.tensor([1, 7]))
    with pytest.raises(IndexError, match="index out of range in self"):
        fireclay.compile(lookup)(torch.tensor([1, 7]))
    assert not _warnings(caplog)


def test_a_backend_returning_none_is_a_reported_failure(caplog):
    def nothing(program, example_inputs):
        return None

    def f(x):
        return torch.sin(x) + 1

    x = torch.randn(3)
    caplog.set_level(logging.WARNING)
    compiled = fireclay.compile(f, backend=nothing)
    torch.testing.assert_close(compiled(x), f(x))
    torch.testing.assert_close(compiled(x), f(x))
    warned = _warnings(caplog)
    assert len(warned) == 1 and "returned None, not a callable" in warned[0], warned
    with pytest.raises(fireclay.BackendCompilerFailed, match="returned None"):
        fireclay.compile(f, backend=nothing, fullgraph=True)(x)


def test_a_frame_that_runs_eagerly_says_so_once(caplog):
    """Code the capture cannot follow at all (here: a generator that changes outside state) runs
    eagerly, with one warning at the default level naming the reason and the line."""
    seen = []

    def produce(n):
        for i in range(n):
            seen.append(i)
            yield i

    def f(x):
        return x + sum(produce(3))

    caplog.set_level(logging.WARNING)
    compiled = fireclay.compile(f, backend="eager")
    x = torch.randn(2)
    for _ in range(3):
        torch.testing.assert_close(compiled(x), f(x))
    warned = _warnings(caplog)
    assert len(warned) <= 1, warned
    assert all("running eagerly" in w and "test_fallback_contract.py" in w for w in warned), warned


def test_fullgraph_error_says_the_function_would_be_split():
    def f(x):
        print("side effect")
        return x + 1

    with pytest.raises(Exception) as raised:
        fireclay.compile(f, fullgraph=True, backend="eager")(torch.ones(2))
    assert "split" in str(raised.value) and "runs eagerly; rewrite" not in str(raised.value)


def test_torch_compile_with_fireclay_falls_back_on_a_graph_it_cannot_convert(monkeypatch, caplog):
    from fireclay import dynamo_backend

    monkeypatch.setattr(dynamo_backend, "from_fx", _raise)

    def f(x):
        return torch.cos(x) * 3

    x = torch.randn(5)
    caplog.set_level(logging.WARNING)
    dynamo = importlib.import_module("torch._dynamo")  # imported here only: other tests run without it
    dynamo.reset()
    compiled = torch.compile(f, backend=dynamo_backend.fireclay)
    torch.testing.assert_close(compiled(x), f(x))
    warned = _warnings(caplog)
    assert len(warned) == 1 and "cannot be converted" in warned[0] and "test_fallback_contract.py" in warned[0], warned
    dynamo.reset()
