"""Code paths libraries take for CUDA tensors, reproduced on the CPU: the same library calls and
patterns (device queries, slices bounded by 0-d tensors, ...) inside one captured function."""

from __future__ import annotations

import collections
import dataclasses
import sys
import types
import warnings

import pytest
import torch

from fireclay_capture import capture, explain


@pytest.fixture
def a_cuda_build(monkeypatch):
    """torch.cuda as on an initialised CUDA build with one compute capability 9.0 device: the
    queries reach C functions (the fork check, the properties), as they do on a GPU."""
    props = types.SimpleNamespace(major=9, minor=0, name="Fake H100", total_memory=80 << 30)
    monkeypatch.setattr(torch.cuda, "_initialized", True)
    monkeypatch.setattr(torch.cuda, "_is_in_bad_fork", sys.is_finalizing)  # a C builtin, False
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(torch.cuda, "_get_device_properties", lambda index: props, raising=False)
    monkeypatch.setattr(torch.cuda, "_get_device_index", _device_index)
    return props


_GPU = torch.device("cuda", 0)


def _device_index(device, optional=False, allow_cpu=False):
    if isinstance(device, str):
        device = torch.device(device)
    return device if isinstance(device, int) else 0 if device is None or device.index is None else device.index


def _grouped_mm_gate(x, w):
    # transformers' integrations/moe.py (_can_use_grouped_mm) on a CUDA weight
    if torch.cuda.get_device_capability(_GPU) >= (8, 0):
        return x @ w
    return (x.unsqueeze(-1) * w).sum(-2)


def _device_facts(x):
    props = torch.cuda.get_device_properties(0)
    major, minor = torch.cuda.get_device_capability()
    scale = props.major * 10 + minor + torch.cuda.device_count()
    return x * scale if torch.cuda.is_initialized() else x


@pytest.mark.parametrize("fn", [_grouped_mm_gate, _device_facts])
def test_cuda_device_queries_are_answered_at_trace_time(a_cuda_build, fn):
    cf = capture(fn, fullgraph=True)
    for _ in range(2):
        x, w = torch.randn(4, 8), torch.randn(8, 3)
        args = (x, w) if fn is _grouped_mm_gate else (x,)
        torch.testing.assert_close(cf(*args), fn(*args))
    assert cf.stats.captures == 1


def test_a_query_of_the_current_device_is_guarded_on_it(a_cuda_build, monkeypatch):
    cf = capture(_device_facts, fullgraph=True)
    x = torch.randn(4, 8)
    torch.testing.assert_close(cf(x), _device_facts(x))
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 1)
    monkeypatch.setattr(torch.cuda, "_get_device_index", lambda device, optional=False, allow_cpu=False: 1)
    a_cuda_build.minor = 5
    torch.testing.assert_close(cf(x), _device_facts(x))
    assert cf.stats.captures == 2


class _Features(torch.nn.ModuleDict):
    # timm's FeatureDictNet._collect (the DETR family's timm backbone): an OrderedDict of the
    # outputs of chosen layers
    def forward(self, x):
        out = collections.OrderedDict()
        for name, module in self.items():
            x = module(x)
            if name != "stem":
                out[name] = x
        pairs = collections.OrderedDict([("first", x.sum())], last=x.mean())
        return out, list(out.values()), pairs


def test_an_ordered_dict_made_in_the_trace_stays_in_one_graph():
    m = _Features({"stem": torch.nn.Linear(8, 8), "a": torch.nn.ReLU(), "b": torch.nn.Linear(8, 4)})
    cf = capture(m, fullgraph=True)
    x = torch.randn(3, 8)
    (out, values, pairs), (expected, expected_values, expected_pairs) = cf(x), m(x)
    assert type(out) is collections.OrderedDict and list(out) == list(expected) == ["a", "b"]
    assert type(pairs) is collections.OrderedDict and list(pairs) == ["first", "last"]
    torch.testing.assert_close((dict(out), values, dict(pairs)), (dict(expected), expected_values, dict(expected_pairs)))


def _scaled_size_sqrt(query_layer: torch.Tensor, scale_factor: int):
    # transformers' DeBERTa (up to 5.17 at least) scripts its small helpers
    return torch.sqrt(torch.tensor(query_layer.size(-1), dtype=torch.float) * scale_factor)


with warnings.catch_warnings():
    warnings.simplefilter("ignore", DeprecationWarning)  # torch.jit.script is deprecated
    _scaled_size_sqrt = torch.jit.script(_scaled_size_sqrt)


def _scripted_helper(q, k):
    return torch.matmul(q / _scaled_size_sqrt(q, 3).to(q.dtype), k.transpose(-1, -2))


def test_a_scripted_function_is_traced_through_its_python_source():
    cf = capture(_scripted_helper, fullgraph=True)
    for _ in range(2):
        q, k = torch.randn(2, 5, 8), torch.randn(2, 5, 8)
        torch.testing.assert_close(cf(q, k), _scripted_helper(q, k))
    assert cf.stats.captures == 1


transformers = pytest.importorskip("transformers")


@dataclasses.dataclass
class _LayerOutput(transformers.utils.ModelOutput):
    last_hidden_state: torch.Tensor | None = None
    attentions: torch.Tensor | None = None
    hidden_states: torch.Tensor | None = None


@dataclasses.dataclass
class _WrappedOutput(_LayerOutput):
    image_outputs: torch.Tensor | None = None


def _rewrap(outputs, x):
    # a ModelOutput made before a graph break reaches the resumed code as an existing object:
    # Qwen3.5-MoE re-wraps it with ``**outputs``, DeBERTa reads ``keys()``
    wrapped = _WrappedOutput(**outputs, image_outputs=x * 2)
    first = outputs[list(outputs.keys())[0]]
    return wrapped, first + outputs.to_tuple()[-1].sum() + len(outputs), outputs["last_hidden_state"].mean()


def test_an_existing_model_output_unpacks_like_a_mapping():
    cf = capture(_rewrap, fullgraph=True)
    for hidden in (None, torch.randn(3)):
        for _ in range(2):
            x = torch.randn(2, 3)
            outputs = _LayerOutput(last_hidden_state=torch.randn(2, 3), hidden_states=hidden)
            (wrapped, a, b), (expected, ea, eb) = cf(outputs, x), _rewrap(outputs, x)
            assert type(wrapped) is _WrappedOutput and list(wrapped.keys()) == list(expected.keys())
            torch.testing.assert_close((wrapped.to_tuple(), a, b), (expected.to_tuple(), ea, eb))
    assert cf.stats.captures == 2  # once per set of present fields


def _keep(outputs, x):
    return outputs, outputs.last_hidden_state * x


def test_an_existing_model_output_returned_is_the_same_object():
    cf = capture(_keep, fullgraph=True)
    outputs, x = _LayerOutput(last_hidden_state=torch.randn(2, 3)), torch.randn(2, 3)
    same, y = cf(outputs, x)
    assert same is outputs
    torch.testing.assert_close(y, outputs.last_hidden_state * x)


def _sequential_experts_gemm(token_states, expert_weights, tokens_per_expert):
    # Aria (transformers 5.17): on CUDA the counts per expert are a CPU tensor, so each slice
    # bound is a 0-d tensor whose value is data
    output = torch.zeros(token_states.shape[0], expert_weights.shape[-1], dtype=token_states.dtype)
    cumsum_num_tokens = torch.cumsum(tokens_per_expert, dim=0)
    cumsum_num_tokens = torch.cat((torch.zeros(1, dtype=torch.long), cumsum_num_tokens))
    for expert_num in range(expert_weights.shape[0]):
        start = cumsum_num_tokens[expert_num]
        end = cumsum_num_tokens[expert_num + 1]
        tokens = token_states[start:end]
        output[start:end] = torch.matmul(tokens, expert_weights[expert_num])
    return output


def _block_attention_mask(patch_embeds_list, tensor):
    # Pixtral's generate_block_attention_mask, with patch counts that are 0-d tensors
    seq_len = tensor.shape[1]
    causal_mask = torch.full((seq_len, seq_len), fill_value=torch.finfo(tensor.dtype).min, dtype=tensor.dtype)
    start = 0
    for num_patches in patch_embeds_list:
        end = start + num_patches
        causal_mask[start:end, start:end] = 0
        start = end
    return causal_mask[None, None, :, :].expand(tensor.shape[0], 1, -1, -1) + tensor.sum()


def _slice_cases():
    counts = torch.tensor([3, 0, 4, 1])
    yield _sequential_experts_gemm, (torch.randn(8, 5), torch.randn(4, 5, 6), counts)
    yield _block_attention_mask, ([torch.tensor(2), torch.tensor(3)], torch.randn(2, 6, 4))


@pytest.mark.parametrize("case", list(_slice_cases()), ids=lambda c: c[0].__name__)
def test_a_slice_bounded_by_a_tensor_breaks_the_graph_there(case):
    fn, args = case
    e = explain(fn)(*args)
    assert e.eager_frames == [] and e.break_count >= 1
    assert any("not a compile-time constant" in r.reason for r in e.break_reasons)
    cf = capture(fn)
    for _ in range(2):
        torch.testing.assert_close(cf(*args), fn(*args))
    assert cf.stats.fallbacks == 0


def _read_back(outputs, x):
    return outputs.to_tuple(), outputs.hidden_states, x + 1


def test_an_existing_model_output_whose_attribute_left_its_mapping_matches_eager():
    cf = capture(_read_back)
    x = torch.randn(2, 3)
    outputs = _LayerOutput(last_hidden_state=torch.randn(2, 3), hidden_states=torch.randn(3))
    torch.testing.assert_close(cf(outputs, x), _read_back(outputs, x))
    outputs.hidden_states = None  # ModelOutput keeps the entry under a None attribute
    torch.testing.assert_close(cf(outputs, x), _read_back(outputs, x))


def _capability_or_none(x):
    try:
        major = torch.cuda.get_device_capability()[0]
    except AssertionError:  # a build without CUDA says so
        major = 0
    return x * major + torch.cuda.device_count() + torch.cuda.is_available()


def test_a_device_query_this_build_cannot_answer_raises_in_the_traced_code():
    cf = capture(_capability_or_none, fullgraph=True)
    x = torch.randn(3)
    torch.testing.assert_close(cf(x), _capability_or_none(x))
