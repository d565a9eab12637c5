"""Artifacts written to text and read back compile to the same results as a fresh trace.

Each case compiles once through a cache that stores the artifact as text, then compiles again
from a cache that only loads that text (tracing is made impossible), and both are checked
against eager on fresh inputs, forward and gradients.
"""

from __future__ import annotations

import copy
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from fx_programs import BatchNorm2d, program_from
from helpers import as_tuple, clone_inputs

from fireclay_autograd import ArtifactError, compile_program, dumps_artifact, loads_artifact
from fireclay_autograd.api import CompiledProgram


class TextCache:
    """Stores artifacts as text; a second compile can only load them."""

    def __init__(self, source):
        self.source = source
        self.texts: dict[str, str] = {}
        self.loaded: list[str] = []
        self.read_only = False

    def load(self, kind: str, inputs: list) -> Any:
        text = self.texts.get(kind)
        if text is None:
            assert not self.read_only, f"no stored {kind} artifact"
            return None
        self.loaded.append(kind)
        return loads_artifact(text, self.source)

    def store(self, kind: str, inputs: list, artifact: Any) -> None:
        assert not self.read_only
        self.texts[kind] = dumps_artifact(artifact)


class MLP(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = torch.nn.Linear(6, 16)
        self.norm = torch.nn.LayerNorm(16)
        self.fc2 = torch.nn.Linear(16, 3)

    def forward(self, x):
        return self.fc2(self.norm(F.gelu(self.fc1(x))))


class ConvBN(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = torch.nn.Conv2d(3, 4, 3, padding=1)
        self.bn = BatchNorm2d(4)

    def forward(self, x):
        return torch.relu(self.bn(self.conv(x))).mean(dim=(2, 3))


def scalar_constant(x):
    return x * torch.tensor(2.5) + torch.tensor([1.0, -2.0, 3.0])


def view_outputs(x):
    y = x * 2
    return y.t(), y[1:], x.view(-1)  # outputs aliasing an intermediate and an input


def views_of_outputs(x):
    y = torch.tanh(x) * 2
    return y, y.view(-1), y[:, 1:].t()  # outputs viewing another output


def mutates_input(x, y):
    y.add_(1.0)
    return x @ y.t()


def several_outputs(x, y):
    return torch.softmax(x, -1), (x * y).sum(), torch.argmax(y, dim=0)


CASES = {
    "mlp": (MLP, lambda: [torch.randn(5, 6)]),
    "conv_bn": (ConvBN, lambda: [torch.randn(2, 3, 6, 6)]),
    "scalar_constant": (lambda: scalar_constant, lambda: [torch.randn(4, 3)]),
    "view_outputs": (lambda: view_outputs, lambda: [torch.randn(3, 4)]),
    "views_of_outputs": (lambda: views_of_outputs, lambda: [torch.randn(3, 4)]),
    "mutates_input": (lambda: mutates_input, lambda: [torch.randn(3, 4), torch.randn(5, 4)]),
    "several_outputs": (lambda: several_outputs, lambda: [torch.randn(4, 5), torch.randn(4, 5)]),
}


def _inputs(make, grad: bool, mutates: bool) -> list[torch.Tensor]:
    xs = make()
    if grad:
        for i, x in enumerate(xs):
            if not (mutates and i == 1):  # an input mutated in place cannot be a leaf that requires grad
                x.requires_grad_(True)
    return xs


def _check(compiled, fn, eager_fn, make, grad: bool, mutates: bool) -> None:
    torch.manual_seed(1)
    inputs = _inputs(make, grad, mutates)
    eager_in, ours_in = clone_inputs(inputs), clone_inputs(inputs)
    with torch.set_grad_enabled(grad):
        expected = as_tuple(eager_fn(*eager_in))
        got = as_tuple(compiled(*ours_in))
    for e, g in zip(expected, got, strict=True):
        torch.testing.assert_close(g, e, atol=1e-5, rtol=1e-5)
    for e, g in zip(eager_in, ours_in):
        torch.testing.assert_close(g, e)  # mutations written back alike
    if not grad:
        return
    pairs = [(e, g) for e, g in zip(expected, got) if e.requires_grad]
    cot = [torch.randn_like(e) for e, _ in pairs]
    leaves_e = [x for x in eager_in if x.requires_grad]
    leaves_g = [x for x in ours_in if x.requires_grad]
    if isinstance(fn, torch.nn.Module):
        leaves_e += list(eager_fn.parameters())
        leaves_g += list(fn.parameters())
    ge = torch.autograd.grad([e for e, _ in pairs], leaves_e, cot, allow_unused=True)
    gg = torch.autograd.grad([g for _, g in pairs], leaves_g, cot, allow_unused=True)
    for a, b in zip(ge, gg, strict=True):
        if a is None:
            assert b is None or bool((b == 0).all())
        else:
            torch.testing.assert_close(b, a, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("grad", [False, True], ids=["inference", "training"])
@pytest.mark.parametrize("name", list(CASES))
def test_artifact_round_trip_matches_eager(name, grad):
    build, make = CASES[name]
    mutates = name == "mutates_input"
    fn = build()
    program = program_from(fn, make())
    kind = "training" if grad else "inference"

    cache = TextCache(program)
    first = compile_program(program, make(), artifact_cache=cache)
    _check(first, fn, copy.deepcopy(fn) if isinstance(fn, torch.nn.Module) else fn, make, grad, mutates)
    assert set(cache.texts) == {kind} and cache.loaded == []

    # The second compile never traces: it must come from the text.
    cache.read_only = True
    second = compile_program(program, make(), artifact_cache=cache)
    second._inference_artifact = second._training_artifact = _no_trace
    if isinstance(fn, torch.nn.Module):
        fn.load_state_dict(copy.deepcopy(fn.state_dict()))
    _check(second, fn, copy.deepcopy(fn) if isinstance(fn, torch.nn.Module) else fn, make, grad, mutates)
    assert cache.loaded == [kind]
    assert isinstance(second, CompiledProgram) and second.graphs is None


def _no_trace(inputs):
    raise AssertionError("traced although an artifact was stored")


def test_artifacts_hold_no_parameter_values():
    fn = torch.nn.Linear(128, 256)
    program = program_from(fn, [torch.randn(5, 128)])
    cache = TextCache(program)
    with torch.no_grad():
        compile_program(program, [torch.randn(5, 128)], artifact_cache=cache)(torch.randn(5, 128))
    text = cache.texts["inference"]
    assert '"constants":[]' in text
    assert len(text) < sum(p.numel() for p in fn.parameters()) * 4  # not even the bytes of the weights
    loaded = loads_artifact(text, program)
    bound = {name: w.data for name, w in loaded.program.weights.items()}
    assert bound and all(bound[name] is program.weights[name].data for name in bound)


@pytest.mark.parametrize("text, match", [
    ("", "not an artifact"),
    ("{\"format\": \"something else\"}", "not a fireclay-autograd-artifact"),
    ("{\"format\": \"fireclay-autograd-artifact\", \"version\": 99}", "version 99"),
    ("{\"format\": \"fireclay-autograd-artifact\", \"version\": 1, \"kind\": \"inference\"}", "malformed"),
])
def test_malformed_artifacts_raise_artifact_error(text, match):
    program = program_from(scalar_constant, [torch.randn(4, 3)])
    with pytest.raises(ArtifactError, match=match):
        loads_artifact(text, program)


def test_truncated_and_edited_artifacts_raise_artifact_error():
    program = program_from(scalar_constant, [torch.randn(4, 3)])
    cache = TextCache(program)
    compile_program(program, [torch.randn(4, 3)], artifact_cache=cache)(torch.randn(4, 3))
    text = cache.texts["inference"]
    for broken in (text[: len(text) // 2], text.replace('"num_user_outputs":1', '"num_user_outputs":"x"'),
                   text.replace('"kind":"inference"', '"kind":"sideways"'),
                   text.replace("aten::", "aten::no_such_op_", 1)):
        assert broken != text
        with pytest.raises(ArtifactError):
            loads_artifact(broken, program)
