"""Compile modes change what the backends do: their options reach user backends and the
``fireclay`` backend's code generators (CUDA graphs and max-autotune on CUDA tensors; on CPU
tensors CUDA graphs are a no-op that says so once)."""

from __future__ import annotations

import logging

import pytest
import torch

import fireclay
from fireclay.backends import builtin


def _mlp():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(5, 7), torch.nn.GELU(), torch.nn.Linear(7, 3))


@pytest.mark.parametrize("mode", [None, *fireclay.list_modes()])
def test_every_mode_reaches_a_user_backend(mode):
    seen = []

    def with_options(program, example_inputs, options=None):
        seen.append(options)
        return lambda *args: fireclay.backends.lookup_backend("eager")(program, example_inputs)(*args)

    f = fireclay.compile(lambda x: torch.sin(x) * 2, backend=with_options, mode=mode)
    x = torch.randn(4)
    torch.testing.assert_close(f(x), torch.sin(x) * 2)
    assert seen == [fireclay.list_mode_options(mode)]


def test_a_backend_without_options_still_compiles_under_a_mode():
    calls = []

    def plain(program, example_inputs):
        calls.append(program)
        return fireclay.backends.lookup_backend("eager")(program, example_inputs)

    f = fireclay.compile(lambda x: x.cos() + 1, backend=plain, mode="max-autotune")
    x = torch.randn(3)
    torch.testing.assert_close(f(x), x.cos() + 1)
    assert len(calls) == 1


@pytest.mark.parametrize("mode", ["reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs"])
@pytest.mark.parametrize("train", [False, True], ids=["inference", "training"])
def test_fireclay_backend_hands_mode_options_to_code_generation(mode, train, monkeypatch):
    seen = []
    real = builtin._codegen_compiler

    def spy(program, example_inputs, options=None, artifacts=None, **rest):
        seen.append(dict(options or {}))
        return real(program, example_inputs, options, artifacts, **rest)

    monkeypatch.setattr(builtin, "_codegen_compiler", spy)
    model = _mlp()
    compiled = fireclay.compile(model, mode=mode)
    x = torch.randn(2, 5, requires_grad=train)
    with torch.set_grad_enabled(train):
        out = compiled(x)
        torch.testing.assert_close(out, model(x))
    if train:
        out.sum().backward()
    assert seen and all(o == fireclay.list_mode_options(mode) for o in seen)
    assert len(seen) == (2 if train else 1)  # forward and backward each get them


def test_cudagraphs_on_cpu_is_a_no_op_logged_once(monkeypatch, caplog):
    monkeypatch.setattr(builtin, "_noted", set())
    model = _mlp()
    with caplog.at_level(logging.INFO, logger="fireclay"):
        compiled = fireclay.compile(model, mode="reduce-overhead")
        for batch in (2, 3):  # two graphs (a recompile), forward and backward: one line
            x = torch.randn(batch, 5, requires_grad=True)
            out = compiled(x)
            torch.testing.assert_close(out, model(x))
            out.sum().backward()
    notes = [r.getMessage() for r in caplog.records if "cudagraphs" in r.getMessage()]
    assert len(notes) == 1 and "CPU" in notes[0] and "changes nothing" in notes[0]


class _FakeTriton:
    """Stands in for fireclay_triton on a machine without a GPU: records what it is asked."""

    def __init__(self):
        import fireclay_triton

        self.config = fireclay_triton.config
        self.calls: list[dict] = []
        self.wrapped: list[tuple] = []

    def compile_program(self, program, example_inputs=None, *, cfg=None, max_autotune=None, background=False):
        import fireclay_cpp

        self.calls.append({"max_autotune": max_autotune, "cfg": cfg})
        return fireclay_cpp.compile_program(program)

    def cudagraphify(self, fn, example_inputs):
        self.wrapped.append((fn, len(example_inputs)))
        return fn


@pytest.mark.parametrize("mode", ["default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs"])
def test_cuda_path_gets_max_autotune_and_cuda_graphs(mode, monkeypatch):
    import sys

    fake = _FakeTriton()
    monkeypatch.setitem(sys.modules, "fireclay_triton", fake)
    torch.manual_seed(0)
    x, w = torch.randn(4, 6), torch.randn(6, 3)
    program = _aten_program(lambda a, b: torch.relu(a @ b).sum(dim=-1), [x, w])
    options = fireclay.list_mode_options(mode)
    compiled = builtin._for_gpu(builtin.scheduled_program(program, [x, w]), [x, w], options)
    torch.testing.assert_close(compiled(x, w)[0], torch.relu(x @ w).sum(dim=-1))
    # the package's own settings (fireclay_triton.config) apply: no copy is passed
    assert fake.calls[0]["cfg"] is None
    assert fake.calls[0]["max_autotune"] is (True if options["max_autotune"] else None)
    assert len(fake.wrapped) == int(options["cudagraphs"])


def _aten_program(fn, inputs):
    from fireclay_autograd import trace_to_aten
    from fireclay_capture import capture

    programs = []

    def keep(program, example_inputs):
        programs.append(program)
        return lambda *args: fireclay.backends.lookup_backend("eager")(program, example_inputs)(*args)

    capture(fn, backend=keep)(*inputs)
    return trace_to_aten(programs[0], inputs)
