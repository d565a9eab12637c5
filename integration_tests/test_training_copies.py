"""Training steps through the whole pipeline on the CPU move no data they need not: after the
first step, no compiled program copies an input into another layout (a saved tensor or
gradient arriving in other strides than compiled for) and no extern result is re-laid out.
Each step is also checked against eager: parameters after the step, gradients, loss."""

from __future__ import annotations

import collections
import copy

import pytest
import torch

import fireclay
import fireclay_cpp.runtime as cpp_runtime
from benchmarks.measure import Step
from benchmarks.models import all_models

MODELS = ["mlp", "transformer_block", "bert", "gpt2", "llama", "cnn_bn"]
# Copies still made, by model, with the reason; when one goes away its line must go too.
KNOWN_COPIES: dict[str, str] = {}


@pytest.fixture
def copies(monkeypatch):
    """Counts of layout copies made by compiled C++ programs while the test runs."""
    seen: collections.Counter = collections.Counter()
    input_base, conform = cpp_runtime.input_base, cpp_runtime.conform

    def counting_input_base(t, name, dtype, size, stride, offset, *rest):
        base = input_base(t, name, dtype, size, stride, offset, *rest)
        if base.untyped_storage().data_ptr() != t.untyped_storage().data_ptr():
            seen[f"input {name}: strides {tuple(t.stride())} compiled for {tuple(stride)}"] += 1
        return base

    def counting_conform(t, size, stride):
        out = conform(t, size, stride)
        if out.untyped_storage().data_ptr() != t.untyped_storage().data_ptr():
            seen[f"extern result: strides {tuple(t.stride())} compiled for {tuple(stride)}"] += 1
        return out

    # The wrapper calls as_base (which calls input_base from this module) and conform by the
    # names bound at compile time: patch both before compiling.
    monkeypatch.setattr(cpp_runtime, "input_base", counting_input_base)
    monkeypatch.setattr(cpp_runtime, "conform", counting_conform)
    return seen


def _snapshot(step: Step, result) -> list[tuple[str, torch.Tensor | None]]:
    output, loss = result
    out = [("loss", loss.detach().clone())]
    for name, p in step.model.named_parameters():
        out.append((f"grad {name}", None if p.grad is None else p.grad.clone()))
        out.append((f"param {name}", p.detach().clone()))
    return out


@pytest.mark.parametrize("name", MODELS)
def test_training_steps_copy_nothing_and_match_eager(name, copies):
    spec = all_models()[name]
    if spec.missing():
        pytest.skip(f"needs {', '.join(spec.missing())}")
    torch.manual_seed(0)
    built = spec.build("small")
    eager_model = built.module
    ours_model = copy.deepcopy(eager_model)
    eager = Step(eager_model, eager_model, "training")
    ours = Step(fireclay.compile(ours_model, fullgraph=True), ours_model, "training")
    for step in range(3):
        inputs = built.make_inputs(10 + step, False)
        if step == 1:
            copies.clear()  # the first step compiles (its example inputs are not counted)
        want, got = _snapshot(eager, eager(inputs)), _snapshot(ours, ours(inputs))
        for (label, w), (_, g) in zip(want, got):
            if w is None or g is None:
                assert w is None or not w.any(), label
                continue
            torch.testing.assert_close(g, w, rtol=2e-4, atol=2e-5, msg=lambda m, label=label: f"{name} {label}: {m}")
    known = KNOWN_COPIES.get(name)
    if known is not None:
        assert copies.pop(known, 0) > 0, f"{name} no longer makes the copy KNOWN_COPIES lists: remove it"
    assert not copies, dict(copies)
