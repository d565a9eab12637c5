"""``fireclay.compile(model, dynamic=True)``: one capture and one compile serve several input sizes.

Dropout is off, so training steps are deterministic. Each case runs a model at several (batch, sequence) sizes through a backend that counts how often
it is asked to compile, and checks outputs (and, in training, every parameter's gradient) against
eager at every size.
"""

import copy

import pytest
import torch

import fireclay
from fireclay.backends import lookup_backend

transformers = pytest.importorskip("transformers")

VOCAB = 128
SIZES = [(2, 8), (3, 5), (2, 13)]


class Block(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.ln1 = torch.nn.LayerNorm(32)
        self.qkv = torch.nn.Linear(32, 96)
        self.out = torch.nn.Linear(32, 32)
        self.ln2 = torch.nn.LayerNorm(32)
        self.mlp = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.GELU(), torch.nn.Linear(64, 32))

    def forward(self, x):
        b, s, _ = x.shape
        q, k, v = self.qkv(self.ln1(x)).view(b, s, 3, 4, 8).permute(2, 0, 3, 1, 4)
        att = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.out(att.transpose(1, 2).reshape(b, s, 32))
        return x + self.mlp(self.ln2(x))


def _model(name):
    t = transformers
    if name == "mlp":
        return torch.nn.Sequential(torch.nn.Linear(32, 48), torch.nn.GELU(), torch.nn.Linear(48, 8))
    if name == "block":
        return Block()
    if name == "bert":
        return t.BertModel(t.BertConfig(vocab_size=VOCAB, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                                        intermediate_size=64, max_position_embeddings=64, hidden_dropout_prob=0.0,
                                        attention_probs_dropout_prob=0.0))
    if name == "gpt2":
        return t.GPT2Model(t.GPT2Config(vocab_size=VOCAB, n_embd=32, n_layer=2, n_head=4, n_positions=64,
                                        bos_token_id=0, eos_token_id=0, resid_pdrop=0.0, embd_pdrop=0.0,
                                        attn_pdrop=0.0))
    if name == "t5":
        return t.T5EncoderModel(t.T5Config(vocab_size=VOCAB, d_model=32, d_kv=8, d_ff=64, num_layers=2, num_heads=4,
                                               dropout_rate=0.0))
    raise KeyError(name)


def _inputs(name, batch, seq):
    if name in ("mlp", "block"):
        return {"input" if name == "mlp" else "x": torch.randn(batch, seq, 32)}
    return {"input_ids": torch.randint(0, VOCAB, (batch, seq))}


def _output(result):
    return result.last_hidden_state if hasattr(result, "last_hidden_state") else result


def _kwargs(name):
    return {"use_cache": False} if name == "gpt2" else {}


@pytest.mark.parametrize("training", [False, True], ids=["inference", "training"])
@pytest.mark.parametrize("backend", ["aot_eager", "fireclay"])
@pytest.mark.parametrize("name", ["mlp", "block", "bert", "gpt2", "t5"])
def test_one_compile_serves_every_size(name, backend, training):
    torch.manual_seed(0)
    model = _model(name).train(training)
    reference = copy.deepcopy(model)
    compiles = []
    inner = lookup_backend(backend)

    def counting(program, example_inputs):
        compiles.append(program)
        return inner(program, example_inputs)

    compiled = fireclay.compile(model, backend=counting, dynamic=True, fullgraph=True)
    for batch, seq in SIZES:
        inputs = _inputs(name, batch, seq)
        with torch.set_grad_enabled(training):
            got = _output(compiled(**inputs, **_kwargs(name)))
            want = _output(reference(**inputs, **_kwargs(name)))
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)
        if training:
            seed = torch.randn_like(want)
            params = [p for p in model.parameters()]
            grads = torch.autograd.grad(got, params, seed, allow_unused=True)
            expected = torch.autograd.grad(want, list(reference.parameters()), seed, allow_unused=True)
            for (param_name, _), g, e in zip(model.named_parameters(), grads, expected):
                if e is None:
                    continue
                assert g is not None, f"{param_name}: no gradient"
                torch.testing.assert_close(g, e, rtol=1e-4, atol=1e-4, msg=lambda m, n=param_name: f"{n}: {m}")
    assert len(compiles) == 1, f"{len(compiles)} compiles for {len(SIZES)} sizes"
