"""Three optimizer steps of small GPT-2-style and Llama-style language models (written in plain
PyTorch so torch.fx can make their programs) equal eager's."""

from __future__ import annotations

import copy
import math

import pytest
import torch
import torch.nn.functional as F
from fx_programs import program_from

from fireclay_autograd import compile_program

VOCAB, DIM, HEADS, SEQ = 50, 32, 4, 8


class GPT2Block(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.ln1 = torch.nn.LayerNorm(DIM)
        self.qkv = torch.nn.Linear(DIM, 3 * DIM)
        self.proj = torch.nn.Linear(DIM, DIM)
        self.ln2 = torch.nn.LayerNorm(DIM)
        self.fc = torch.nn.Linear(DIM, 4 * DIM)
        self.out = torch.nn.Linear(4 * DIM, DIM)

    def forward(self, x, mask):
        b, t, d = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(DIM, dim=2)
        q = q.view(b, t, HEADS, d // HEADS).transpose(1, 2)
        k = k.view(b, t, HEADS, d // HEADS).transpose(1, 2)
        v = v.view(b, t, HEADS, d // HEADS).transpose(1, 2)
        att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(d // HEADS))
        att = att.masked_fill(mask, float("-inf")).softmax(-1)
        y = (att @ v).transpose(1, 2).contiguous().view(b, t, d)
        x = x + self.proj(y)
        return x + self.out(F.gelu(self.fc(self.ln2(x)), approximate="tanh"))


class GPT2(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.wte = torch.nn.Embedding(VOCAB, DIM)
        self.wpe = torch.nn.Embedding(SEQ, DIM)
        self.blocks = torch.nn.ModuleList([GPT2Block(), GPT2Block()])
        self.ln_f = torch.nn.LayerNorm(DIM)
        self.register_buffer("mask", torch.triu(torch.ones(SEQ, SEQ, dtype=torch.bool), 1))

    def forward(self, ids):
        x = self.wte(ids) + self.wpe(torch.arange(SEQ))
        for block in self.blocks:
            x = block(x, self.mask)
        return self.ln_f(x) @ self.wte.weight.t()  # tied embeddings


class RMSNorm(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.ones(DIM))

    def forward(self, x):
        return self.weight * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6))


def rotate_half(x):
    x1, x2 = x[..., : x.shape[-1] // 2], x[..., x.shape[-1] // 2:]
    return torch.cat((-x2, x1), dim=-1)


class LlamaBlock(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.norm1 = RMSNorm()
        self.q = torch.nn.Linear(DIM, DIM, bias=False)
        self.k = torch.nn.Linear(DIM, DIM, bias=False)
        self.v = torch.nn.Linear(DIM, DIM, bias=False)
        self.o = torch.nn.Linear(DIM, DIM, bias=False)
        self.norm2 = RMSNorm()
        self.gate = torch.nn.Linear(DIM, 64, bias=False)
        self.up = torch.nn.Linear(DIM, 64, bias=False)
        self.down = torch.nn.Linear(64, DIM, bias=False)

    def forward(self, x, cos, sin):
        b, t, d = x.shape
        h = self.norm1(x)
        q = self.q(h).view(b, t, HEADS, d // HEADS).transpose(1, 2)
        k = self.k(h).view(b, t, HEADS, d // HEADS).transpose(1, 2)
        v = self.v(h).view(b, t, HEADS, d // HEADS).transpose(1, 2)
        q = q * cos + rotate_half(q) * sin
        k = k * cos + rotate_half(k) * sin
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.o(y.transpose(1, 2).reshape(b, t, d))
        h = self.norm2(x)
        return x + self.down(F.silu(self.gate(h)) * self.up(h))


class Llama(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = torch.nn.Embedding(VOCAB, DIM)
        self.blocks = torch.nn.ModuleList([LlamaBlock(), LlamaBlock()])
        self.norm = RMSNorm()
        self.head = torch.nn.Linear(DIM, VOCAB, bias=False)
        inv = 1.0 / (10000 ** (torch.arange(0, DIM // HEADS, 2).float() / (DIM // HEADS)))
        freqs = torch.outer(torch.arange(SEQ).float(), inv)
        emb = torch.cat((freqs, freqs), dim=-1)
        self.register_buffer("cos", emb.cos())
        self.register_buffer("sin", emb.sin())

    def forward(self, ids):
        x = self.embed(ids)
        for block in self.blocks:
            x = block(x, self.cos, self.sin)
        return self.head(self.norm(x))


# GPT-2 trains with SGD: the gradient of its key bias is zero up to rounding (softmax ignores a
# per-row constant), and Adam would scale that rounding noise up to full-size steps.
@pytest.mark.parametrize("model_cls,optimizer", [
    (GPT2, lambda params: torch.optim.SGD(params, lr=0.1, momentum=0.9)),
    (Llama, lambda params: torch.optim.AdamW(params, lr=1e-2)),
], ids=["gpt2_style_sgd", "llama_style_adamw"])
def test_three_training_steps_match_eager(model_cls, optimizer):
    torch.manual_seed(0)
    ours = model_cls()
    eager = copy.deepcopy(ours)
    batches = [(torch.randint(0, VOCAB, (2, SEQ)), torch.randint(0, VOCAB, (2, SEQ))) for _ in range(3)]
    compiled = compile_program(program_from(ours, [batches[0][0]]), [batches[0][0]])

    def train(model, forward):
        opt = optimizer(model.parameters())
        losses = []
        for ids, labels in batches:
            opt.zero_grad()
            loss = F.cross_entropy(forward(ids).flatten(0, 1), labels.flatten())
            loss.backward()
            opt.step()
            losses.append(loss.item())
        return losses

    ours_losses = train(ours, lambda ids: compiled(ids)[0])
    eager_losses = train(eager, eager)
    assert ours_losses == pytest.approx(eager_losses, rel=1e-4)
    for (name, p), (_, q) in zip(ours.named_parameters(), eager.named_parameters()):
        torch.testing.assert_close(p, q, atol=1e-4, rtol=1e-4, msg=lambda m, name=name: f"{name}: {m}")
    # Only cheap ops were recomputed for the backward.
    from fireclay_autograd import is_recomputable

    assert all(is_recomputable(op) for op in compiled.graphs.partition.recomputed)
