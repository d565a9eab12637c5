"""Real models captured in one graph each, with outputs equal to eager."""

from __future__ import annotations

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

from fireclay_capture import capture


class BasicBlock(nn.Module):
    def __init__(self, cin, cout, stride=1):
        super().__init__()
        self.conv1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(cout)
        self.conv2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(cout)
        self.downsample = None
        if stride != 1 or cin != cout:
            self.downsample = nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout))

    def forward(self, x):
        identity = x if self.downsample is None else self.downsample(x)
        out = F.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        return F.relu(out + identity)


class ResNet(nn.Module):
    def __init__(self, widths=(8, 16, 32), classes=10):
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, widths[0], 3, 1, 1, bias=False), nn.BatchNorm2d(widths[0]), nn.ReLU())
        layers = []
        cin = widths[0]
        for i, w in enumerate(widths):
            layers.append(nn.Sequential(BasicBlock(cin, w, stride=1 if i == 0 else 2), BasicBlock(w, w)))
            cin = w
        self.layers = nn.ModuleList(layers)
        self.head = nn.Linear(cin, classes)

    def forward(self, x):
        x = self.stem(x)
        for layer in self.layers:
            x = layer(x)
        x = F.adaptive_avg_pool2d(x, 1).flatten(1)
        return self.head(x)


def _check_model(model, make_inputs, calls=2, atol=1e-5, **call_kwargs):
    cf = capture(model, fullgraph=True)
    for _ in range(calls):
        args = make_inputs()
        expected = model(*args, **call_kwargs)
        actual = cf(*args, **call_kwargs)
        _assert_close_tree(actual, expected, atol)
    assert (cf.stats.captures, cf.stats.recompiles, cf.stats.fallbacks) == (1, 0, 0)
    # The program is valid IR and survives the serialized format.
    from fireclay_ir import dumps, loads
    from fireclay_ir.verifier import verify

    verify(cf.last_program)
    text = dumps(cf.last_program)
    assert dumps(loads(text)) == text
    return cf


def _assert_close_tree(a, e, atol):
    if isinstance(e, torch.Tensor):
        torch.testing.assert_close(a, e, atol=atol, rtol=1e-4)
    elif isinstance(e, dict):
        assert list(a.keys()) == list(e.keys())
        for k in e:
            _assert_close_tree(a[k], e[k], atol)
    elif isinstance(e, (list, tuple)):
        assert len(a) == len(e)
        for x, y in zip(a, e):
            _assert_close_tree(x, y, atol)
    else:
        assert a == e


def test_resnet_style_cnn_eval():
    torch.manual_seed(0)
    model = ResNet().eval()
    cf = _check_model(model, lambda: (torch.randn(2, 3, 16, 16),))
    convs = cf.last_program.main.find("torch::torch.conv2d")
    assert len(convs) == 1 + 2 * 2 * 3 + 2  # stem, two convs per block, two downsamples


def test_resnet_style_cnn_training_mode_with_grad():
    torch.manual_seed(0)
    model = ResNet().train()
    cf = capture(model, fullgraph=True)
    x = torch.randn(2, 3, 16, 16)
    eager_model = ResNet().train()
    eager_model.load_state_dict(model.state_dict())
    expected = eager_model(x)
    actual = cf(x)
    torch.testing.assert_close(actual, expected, atol=1e-5, rtol=1e-4)
    assert actual.requires_grad
    actual.sum().backward()
    expected.sum().backward()
    torch.testing.assert_close(model.head.weight.grad, eager_model.head.weight.grad, atol=1e-5, rtol=1e-4)
    # BatchNorm running stats were updated in place by the graph, as eagerly.
    torch.testing.assert_close(model.stem[1].running_mean, eager_model.stem[1].running_mean)


transformers = pytest.importorskip("transformers")


def _ids(batch=2, seq=7, vocab=100):
    return torch.randint(0, vocab, (batch, seq))


def test_hf_bert_tiny():
    config = transformers.BertConfig(vocab_size=100, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                                     intermediate_size=64, max_position_embeddings=64)
    torch.manual_seed(0)
    model = transformers.BertModel(config).eval()
    _check_model(model, lambda: (_ids(),))


def test_hf_gpt2_tiny():
    config = transformers.GPT2Config(vocab_size=100, n_embd=32, n_layer=2, n_head=4, n_positions=64)
    torch.manual_seed(0)
    model = transformers.GPT2LMHeadModel(config).eval()
    _check_model(model, lambda: (_ids(),), use_cache=False)


def test_hf_llama_tiny():
    config = transformers.LlamaConfig(vocab_size=100, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64)
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(config).eval()
    _check_model(model, lambda: (_ids(),), use_cache=False)


def test_hf_t5_tiny():
    config = transformers.T5Config(vocab_size=100, d_model=32, d_kv=8, d_ff=64, num_layers=2, num_heads=4,
                                   decoder_start_token_id=0)
    torch.manual_seed(0)
    model = transformers.T5Model(config).eval()
    _check_model(model, lambda: (_ids(),), decoder_input_ids=_ids(seq=5), use_cache=False)


def _gpt2_model():
    return transformers.GPT2Model(transformers.GPT2Config(vocab_size=128, n_embd=32, n_layer=2, n_head=4,
                                                          bos_token_id=0, eos_token_id=0))


def _llama_model():
    return transformers.LlamaModel(transformers.LlamaConfig(
        vocab_size=128, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=64))


def _gpt2_lm():
    return transformers.GPT2LMHeadModel(transformers.GPT2Config(vocab_size=128, n_embd=32, n_layer=3, n_head=4))


def _assert_same_cache(actual, expected):
    assert type(actual) is type(expected)
    assert actual.get_seq_length() == expected.get_seq_length()
    assert len(actual.layers) == len(expected.layers)
    for a, e in zip(actual.layers, expected.layers):
        assert type(a) is type(e) and a.is_initialized == e.is_initialized
        torch.testing.assert_close(a.keys, e.keys, atol=1e-5, rtol=1e-4)
        torch.testing.assert_close(a.values, e.values, atol=1e-5, rtol=1e-4)


@pytest.mark.parametrize("make", [_gpt2_model, _llama_model, _gpt2_lm], ids=["gpt2", "llama", "gpt2_lm"])
@pytest.mark.parametrize("batch,seq", [(2, 7), (1, 5)])
def test_hf_decoder_with_default_cache_in_one_graph(make, batch, seq):
    """``use_cache`` left at its default: the DynamicCache the model builds is returned
    (past_key_values) and rebuilt around the graph's key/value tensors."""
    torch.manual_seed(0)
    model = make().eval()
    cf = capture(model, fullgraph=True)
    for _ in range(2):
        ids = torch.randint(0, 128, (batch, seq))
        expected = model(input_ids=ids)
        actual = cf(input_ids=ids)
        assert type(actual) is type(expected) and list(actual.keys()) == list(expected.keys())
        for key in expected.keys():
            if key not in ("past_key_values", "cache"):
                _assert_close_tree(actual[key], expected[key], 1e-5)
        _assert_same_cache(actual.past_key_values, expected.past_key_values)
        # The rebuilt cache is a working cache: decoding one more token from it matches eager.
        nxt = torch.randint(0, 128, (batch, 1))
        first = next(iter(expected.keys()))
        torch.testing.assert_close(model(input_ids=nxt, past_key_values=actual.past_key_values)[first],
                                   model(input_ids=nxt, past_key_values=expected.past_key_values)[first],
                                   atol=1e-5, rtol=1e-4)
    assert (cf.stats.captures, cf.stats.recompiles, cf.stats.fallbacks) == (1, 0, 0)
