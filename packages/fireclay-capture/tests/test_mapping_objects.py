"""Library idioms around mappings and outputs that used to send frames to eager: attribute writes
on a ModelOutput built in forward, a UserDict subclass made in the trace, a registry dict
subclass whose ``__getitem__`` builds a module (``super().__getitem__``), a NumPy ufunc of a
constant, ``list[int]`` in a nested def, ``issubclass``. Each against eager, in one graph."""

from __future__ import annotations

import collections
import dataclasses

import numpy as np
import pytest
import torch

from fireclay_capture import capture, explain

transformers = pytest.importorskip("transformers")
ModelOutput = transformers.utils.ModelOutput


@dataclasses.dataclass
class PooledOutput(ModelOutput):
    last_hidden_state: torch.Tensor | None = None
    pooler_output: torch.Tensor | None = None
    hidden_states: torch.Tensor | None = None


class Tanh2(torch.nn.Module):  # keeps nn.Module's constructor: building it has no effect
    def forward(self, x):
        return torch.tanh(x) * 2


class Instantier(collections.OrderedDict):
    """transformers' ACT2FN: a lookup builds the module the entry names."""

    def __getitem__(self, key):
        content = super().__getitem__(key)
        cls, kwargs = content if isinstance(content, tuple) else (content, {})
        return cls(**kwargs)


ACTIVATIONS = Instantier({"tanh2": Tanh2, "relu": torch.nn.ReLU, "leaky": (torch.nn.LeakyReLU, {"negative_slope": 0.2})})


class Shared(collections.UserDict):
    pass


def _encode(x):
    return PooledOutput(last_hidden_state=x * 2, pooler_output=x.sum(-1))


def replace_a_present_field(x):
    out = _encode(x)
    out.pooler_output = out.pooler_output + 1
    return out


def set_the_last_field(x):
    out = _encode(x)
    out.hidden_states = x - 1  # absent before, and no later field is present: appended in order
    return out.to_tuple()


def set_an_item(x):
    out = _encode(x)
    out["pooler_output"] = out.last_hidden_state.mean()
    return out[1], out.pooler_output


def user_dict_made_in_the_trace(x):
    shared = Shared({"a": x})
    shared["b"] = x * 3
    del shared["a"]
    return shared["b"] + len(shared)


def registry_builds_a_module(x):
    return ACTIVATIONS["tanh2"](x) + ACTIVATIONS["relu"](x) + ACTIVATIONS["leaky"](x)


def numpy_ufunc_of_a_constant(x):
    return x * np.sqrt(16) + np.exp(0.0)


def annotation_in_a_nested_def(x):
    def helper(items: list[torch.Tensor], scale: dict[str, float]) -> torch.Tensor:
        return items[0] * scale["s"]

    return helper([x], {"s": 2.0})


def issubclass_of_classes(x):
    return x * (2 if issubclass(torch.nn.ReLU, (torch.nn.Module, int)) else 3) + issubclass(bool, str)


CASES = [replace_a_present_field, set_the_last_field, set_an_item, user_dict_made_in_the_trace,
         registry_builds_a_module, numpy_ufunc_of_a_constant, annotation_in_a_nested_def, issubclass_of_classes]


def _same(actual, expected):
    if isinstance(expected, ModelOutput):
        assert type(actual) is type(expected) and list(actual.keys()) == list(expected.keys())
        actual, expected = actual.to_tuple(), expected.to_tuple()
    torch.testing.assert_close(actual, expected)


@pytest.mark.parametrize("fn", CASES, ids=lambda f: f.__name__)
def test_matches_eager_in_one_graph(fn):
    compiled = capture(fn, fullgraph=True)
    for _ in range(2):
        x = torch.randn(2, 3)
        _same(compiled(x), fn(x))
    assert compiled.stats.captures == 1
    e = explain(fn)(torch.randn(2, 3))
    assert (e.graph_count, e.break_count) == (1, 0)


def field_set_out_of_order(x):
    out = PooledOutput(last_hidden_state=x, hidden_states=x + 1)
    out.pooler_output = x * 2  # eager appends its key last, after hidden_states
    return out.to_tuple()


def field_set_back_to_none(x):
    out = _encode(x)
    out.pooler_output = None  # eager keeps the old entry under a None attribute
    return out.to_tuple(), out.pooler_output


@pytest.mark.parametrize("fn", [field_set_out_of_order, field_set_back_to_none], ids=lambda f: f.__name__)
def test_model_output_writes_the_trace_does_not_model_still_match_eager(fn):
    x = torch.randn(2, 3)
    torch.testing.assert_close(capture(fn)(x), fn(x))
