"""Real models through the whole pipeline (capture → autograd → loops → cpp) against eager."""

import copy

import pytest
import torch

import fireclay

transformers = pytest.importorskip("transformers")

VOCAB = 128


def _hf(name):
    c = transformers
    if name == "bert":
        return c.BertModel(c.BertConfig(vocab_size=VOCAB, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                                        intermediate_size=64, max_position_embeddings=64)), {}
    if name == "gpt2":
        return c.GPT2Model(c.GPT2Config(vocab_size=VOCAB, n_embd=32, n_layer=2, n_head=4, n_positions=64,
                                        bos_token_id=0, eos_token_id=0)), {"use_cache": False}
    if name == "llama":
        return c.LlamaModel(c.LlamaConfig(vocab_size=VOCAB, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                                          num_key_value_heads=2, intermediate_size=64, max_position_embeddings=64)), \
            {"use_cache": False}
    raise KeyError(name)


class SmallCNN(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.conv1 = torch.nn.Conv2d(3, 8, 3, padding=1)
        self.bn1 = torch.nn.BatchNorm2d(8)
        self.conv2 = torch.nn.Conv2d(8, 8, 3, padding=1)
        self.bn2 = torch.nn.BatchNorm2d(8)
        self.head = torch.nn.Linear(8, 5)

    def forward(self, x):
        y = torch.relu(self.bn1(self.conv1(x)))
        y = torch.relu(self.bn2(self.conv2(y)) + y)
        return self.head(y.mean((2, 3)))


@pytest.mark.parametrize("backend", ["aot_eager", "fireclay"])
@pytest.mark.parametrize("name", ["bert", "gpt2", "llama"])
def test_hf_inference_in_one_graph_matches_eager(name, backend):
    torch.manual_seed(0)
    model, kwargs = _hf(name)
    model.eval()
    compiled = fireclay.compile(model, backend=backend, fullgraph=True)
    for _ in range(2):
        ids = torch.randint(0, VOCAB, (2, 12))
        with torch.no_grad():
            got = compiled(input_ids=ids, **kwargs).last_hidden_state
            want = model(input_ids=ids, **kwargs).last_hidden_state
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)


def _train(model, compiled, batches, lr=0.05):
    opt = torch.optim.SGD(model.parameters(), lr=lr)
    for inputs, loss_of in batches:
        opt.zero_grad()
        loss_of(compiled(**inputs)).backward()
        opt.step()


# The CNN's backward graph holds convolution_backward with a masked (undefined) input gradient.
@pytest.mark.parametrize("name", ["bert", "gpt2", "llama", "cnn"])
def test_three_training_steps_match_eager(name):
    torch.manual_seed(0)
    if name == "cnn":
        model, kwargs = SmallCNN(), {}
        batches = [({"x": torch.randn(4, 3, 8, 8)}, lambda out: out.pow(2).mean()) for _ in range(3)]
    else:
        model, kwargs = _hf(name)
        batches = [({"input_ids": torch.randint(0, VOCAB, (2, 10)), **kwargs},
                    lambda out: out.last_hidden_state.pow(2).mean()) for _ in range(3)]
    model.train()
    if name != "cnn":
        model.config.attention_dropout = getattr(model.config, "attention_dropout", 0.0)
        for m in model.modules():
            if isinstance(m, torch.nn.Dropout):
                m.p = 0.0
    reference = copy.deepcopy(model)
    _train(model, fireclay.compile(model, backend="fireclay", fullgraph=True), batches)
    _train(reference, reference, batches)
    for (key, got), want in zip(model.state_dict().items(), reference.state_dict().values()):
        torch.testing.assert_close(got, want, rtol=2e-4, atol=2e-4, msg=key)
