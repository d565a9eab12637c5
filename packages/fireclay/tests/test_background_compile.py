"""Tiered execution in the ``fireclay`` backend (fireclay.tiered): a CUDA graph runs in the
interpreter while its Triton kernels compile in the background, then on its kernels; a backward
compiles after its forward switched; a failed background compile keeps the graph in the
interpreter for good with one warning; ``wait_compiled`` waits for pending compiles.

Without a GPU: CPU tensors are routed to fireclay-triton (``_targets_gpu``), its kernels run in
Triton's interpreter, and the compile step, which the interpreter does not have, is replaced by
a fake that waits on a gate the test opens (a slow compile) or raises (a failed compile)."""

from __future__ import annotations

import copy
import logging
import os
import threading

import pytest
import torch
import torch.nn.functional as F

import fireclay
from fireclay.backends import builtin
from fireclay.config import Config


class Gate:
    """Stands in for compiling a program's kernels ahead: each compile waits until the gate is
    open, then returns or raises ``error``; records the thread each compile ran on."""

    def __init__(self):
        self.open = threading.Event()
        self.threads: list[str] = []
        self.error: BaseException | None = None

    def __call__(self, compiled, cfg, interpret):
        self.threads.append(threading.current_thread().name)
        assert self.open.wait(60), "the test never opened the gate"
        if self.error is not None:
            raise self.error


@pytest.fixture
def gpu_path(monkeypatch, tmp_path):
    """Graphs go to fireclay-triton (interpreted); returns the gate and the tiered graphs made."""
    from fireclay_triton import api as triton_api

    if os.environ.get("TRITON_INTERPRET") != "1":
        pytest.skip("routes CPU tensors to Triton's interpreter (see conftest)")
    monkeypatch.setattr(builtin, "_targets_gpu", lambda example_inputs: True)
    gate = Gate()
    monkeypatch.setattr(triton_api, "_compile_ahead", gate)
    made = []
    real = builtin.tiered

    def spy(compiled, interpreted, where):
        result = real(compiled, interpreted, where)
        made.append(result)
        return result

    monkeypatch.setattr(builtin, "tiered", spy)
    fireclay.wait_compiled()  # forget graphs of earlier tests
    with fireclay.config.shared.patch(cache_dir=str(tmp_path)), fireclay.config.patch(background_compile=True):
        yield gate, made
    gate.open.set()  # never leave the background thread waiting for the next test
    fireclay.wait_compiled(60)


class Counting:
    """A compiled program that counts its calls."""

    def __init__(self, inner):
        self.inner, self.calls = inner, 0

    def __call__(self, *inputs):
        self.calls += 1
        return self.inner(*inputs)

    def __getattr__(self, name):
        return getattr(self.inner, name)


def _mlp():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(6, 16), torch.nn.LayerNorm(16), torch.nn.GELU(),
                               torch.nn.Linear(16, 3))


def _close(a, b):
    torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("fullgraph", [False, True])
def test_inference_runs_interpreted_until_ready_then_compiled(gpu_path, fullgraph):
    gate, made = gpu_path
    model = _mlp()
    compiled = fireclay.compile(model, fullgraph=fullgraph)
    with torch.no_grad():
        for _ in range(2):  # the kernels are still compiling: the interpreter answers
            x = torch.randn(5, 6)
            _close(compiled(x), model(x))
        (graph,) = made
        assert isinstance(graph, fireclay.tiered.TieredGraph) and graph.interpreted_calls == 2
        assert not graph.settled() and gate.threads == ["fireclay-triton-background_0"]
        graph.compiled = Counting(graph.compiled)
        gate.open.set()
        assert fireclay.wait_compiled(60) == 1
        for _ in range(2):  # switched: the compiled program answers
            x = torch.randn(5, 6)
            _close(compiled(x), model(x))
        assert graph.settled() and graph.interpreted_calls == 2 and graph.compiled.calls == 2
    assert fireclay.wait_compiled() == 0


def _train_steps(compiled, model, reference, steps, make):
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    ref_opt = torch.optim.SGD(reference.parameters(), lr=0.1)
    for _ in range(steps):
        x = make()
        for m, o in ((compiled, opt), (reference, ref_opt)):
            o.zero_grad()
            m(x).pow(2).mean().backward()
        for p, q in zip(model.parameters(), reference.parameters()):
            _close(p.grad, q.grad)
        opt.step()
        ref_opt.step()
    for p, q in zip(model.parameters(), reference.parameters()):
        _close(p, q)


def test_training_backward_compiles_after_its_forward_switched(gpu_path, monkeypatch):
    gate, made = gpu_path
    compiles = []
    real = builtin._codegen_compiler
    monkeypatch.setattr(builtin, "_codegen_compiler", lambda *a, **k: compiles.append(a[0]) or real(*a, **k))
    model = _mlp()
    reference = copy.deepcopy(model)
    compiled = fireclay.compile(model)

    def steps(n):
        _train_steps(compiled, model, reference, n, lambda: torch.randn(5, 6))

    steps(2)  # forward compiling: both halves interpreted, the backward not compiled yet
    assert len(made) == 1 and len(compiles) == 1 and made[0].interpreted_calls == 2
    gate.open.set()
    assert fireclay.wait_compiled(60) == 1
    gate.open.clear()
    steps(2)  # forward switched; the backward now compiles (held at the gate) and is interpreted
    forward, backward = made
    assert forward.settled() and forward.interpreted_calls == 2
    assert len(compiles) == 2 and not backward.settled() and backward.interpreted_calls == 2
    gate.open.set()
    assert fireclay.wait_compiled(60) == 1
    steps(2)  # both halves compiled
    assert backward.settled() and backward.interpreted_calls == 2
    assert fireclay.wait_compiled() == 0 and len(gate.threads) == 2


@pytest.mark.parametrize("fullgraph", [False, True])
@pytest.mark.parametrize("train", [False, True], ids=["inference", "training"])
def test_a_failed_background_compile_falls_back_for_good_with_one_warning(gpu_path, caplog, train, fullgraph):
    from fireclay_triton import CodegenError

    gate, made = gpu_path
    gate.error = CodegenError("kernel k1 does not compile with any launch config: out of resources")
    model = _mlp()
    reference = copy.deepcopy(model)
    compiled = fireclay.compile(model, fullgraph=fullgraph)
    with caplog.at_level(logging.WARNING, logger="fireclay"):
        if train:
            _train_steps(compiled, model, reference, 1, lambda: torch.randn(4, 6))
            gate.open.set()
            assert fireclay.wait_compiled(60) == 1
            _train_steps(compiled, model, reference, 3, lambda: torch.randn(4, 6))
        else:
            with torch.no_grad():
                x = torch.randn(4, 6)
                _close(compiled(x), model(x))
                gate.open.set()
                assert fireclay.wait_compiled(60) == 1
                for _ in range(3):
                    x = torch.randn(4, 6)
                    _close(compiled(x), model(x))
    warnings = [r.getMessage() for r in caplog.records if "in the background failed" in r.getMessage()]
    assert len(warnings) == (2 if train else 1)  # one per graph: forward and backward (each tried once)
    assert all("CodegenError: kernel k1 does not compile" in w and "interpreter from now on" in w for w in warnings)
    assert all(g.failed is gate.error and g.settled() for g in made)


def test_a_compile_that_failed_before_the_first_call_falls_back_at_once(gpu_path, caplog):
    gate, made = gpu_path
    gate.error = RuntimeError("ptxas crashed")
    gate.open.set()
    model = _mlp()
    compiled = fireclay.compile(model)
    x = torch.randn(3, 6)
    with caplog.at_level(logging.WARNING, logger="fireclay"), torch.no_grad():
        for _ in range(3):
            _close(compiled(x), model(x))
    said = [r.getMessage() for r in caplog.records if "ptxas crashed" in r.getMessage()]
    assert len(said) == 1 and "interpreter" in said[0]


def _mutates_and_aliases(x, y):
    x.mul_(2)
    return x[1:], y + x, x.t()


def test_input_mutation_and_aliasing_match_eager_on_both_paths(gpu_path):
    gate, _ = gpu_path
    compiled = fireclay.compile(_mutates_and_aliases)

    def check():
        x, y = torch.randn(3, 4), torch.randn(3, 4)
        x_eager = x.clone()
        got, want = compiled(x, y), _mutates_and_aliases(x_eager, y)
        _close(x, x_eager)  # the input was updated in place
        for g, w in zip(got, want):
            _close(g, w)
        got[0].add_(1)  # outputs view the input, as in eager
        _close(x[1:], got[0])

    check()
    gate.open.set()
    assert fireclay.wait_compiled(60) == 1
    check()
    check()


def _dropout(x):
    return F.dropout(x, p=0.5, training=True) * 3


def test_random_ops_are_correct_on_both_paths(gpu_path):
    gate, made = gpu_path
    compiled = fireclay.compile(_dropout)

    def check():
        x = torch.rand(64, 64) + 1.0  # never zero
        out = compiled(x)
        kept = out != 0
        _close(out[kept], (x * 6)[kept])  # scaled by 1 / (1 - p), then by 3
        assert 0.3 < kept.float().mean().item() < 0.7

    check()
    gate.open.set()
    assert fireclay.wait_compiled(60) == 1
    check()
    assert made[0].settled() and made[0].failed is None


@pytest.mark.parametrize("how", ["config", "reduce-overhead"])
def test_background_compile_is_off_when_asked_and_under_cuda_graphs(gpu_path, how):
    gate, made = gpu_path
    gate.open.set()
    model = _mlp()
    x = torch.randn(2, 6)
    with torch.no_grad(), fireclay.config.patch(background_compile=how != "config"):
        compiled = fireclay.compile(model, mode="reduce-overhead" if how == "reduce-overhead" else None)
        _close(compiled(x), model(x))
    assert made == [] and gate.threads == [threading.current_thread().name]  # compiled before the first call


def test_environment_variable_turns_it_off(monkeypatch):
    assert Config().background_compile is True
    monkeypatch.setenv("FIRECLAY_BACKGROUND_COMPILE", "0")
    assert Config.from_environment().background_compile is False


def test_wait_compiled_times_out_while_a_compile_is_held(gpu_path):
    gate, _ = gpu_path
    model = _mlp()
    compiled = fireclay.compile(model)
    with torch.no_grad():
        compiled(torch.randn(2, 6))
    with pytest.raises(TimeoutError, match="still compiling"):
        fireclay.wait_compiled(0.01)
    gate.open.set()
    assert fireclay.wait_compiled(60) == 1
