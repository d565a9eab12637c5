"""A language model's loss in training: log_softmax and the targets' one-hot are redone inside the
backward's kernels (not saved as tensors the size of the logits), the targets shifted and stored
in the loop that gathers with them. Compared with eager, loss and every gradient, with the run
held to compiled code: a fallback to the interpreter fails the test."""

from __future__ import annotations

import copy
import logging

import pytest
import torch
import torch.nn.functional as F

import fireclay


def _no_fallback(caplog):
    said = [r.getMessage() for r in caplog.records if "fireclay" in r.getMessage() and r.levelno >= logging.WARNING]
    assert not said, said


def _shifted_loss(x, src):
    # a library call (cumsum) reads `big` from memory and frees it; the targets, made after it in
    # the same loop that gathers with them, may be stored where `big` was: a check of their range
    # made before that loop would read `big`'s bytes
    big = torch.cumsum(src * 1000003 + 10**12, 1)
    y = x + (big[..., None] > 0) * 0.5
    shifted = F.pad(src, (0, 1), value=-100)[..., 1:]
    labels = torch.where((shifted != -100) & (big > 0), shifted, 0)
    return y.gather(-1, labels.unsqueeze(-1)).sum(), labels * 1


@pytest.mark.parametrize("rows, cols, classes", [(2, 16, 7), (1, 5, 3), (3, 33, 100)])
def test_indices_stored_in_the_loop_that_gathers_with_them_are_checked_after_they_are_made(
        rows, cols, classes, caplog):
    torch.manual_seed(rows * cols)
    x = torch.randn(rows, cols, classes, requires_grad=True)
    src = torch.randint(0, classes, (rows, cols))
    with caplog.at_level(logging.WARNING, logger="fireclay"):
        got = fireclay.compile(_shifted_loss, fullgraph=True)(x, src)
    want = _shifted_loss(x, src)
    torch.testing.assert_close(got, want)
    _no_fallback(caplog)


def _models():
    from transformers import GPT2Config, GPT2LMHeadModel, LlamaConfig, LlamaForCausalLM

    return {
        "gpt2": lambda: GPT2LMHeadModel(GPT2Config(n_embd=32, n_layer=1, n_head=2, vocab_size=301, n_positions=32,
                                                   resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0, use_cache=False)),
        "llama": lambda: LlamaForCausalLM(LlamaConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                                                      num_attention_heads=2, num_key_value_heads=1, vocab_size=299,
                                                      use_cache=False)),
    }


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("name", ["gpt2", "llama"])
def test_causal_lm_loss_and_gradients_match_eager(name, dtype, caplog):
    pytest.importorskip("transformers")
    torch.manual_seed(0)
    model = _models()[name]().to(dtype)
    ours = copy.deepcopy(model)
    ids = torch.randint(0, model.config.vocab_size, (2, 24))
    labels = ids.clone()
    labels[0, 3] = labels[1, 10] = -100  # ignored positions
    want = model(input_ids=ids, labels=labels).loss
    want.backward()
    with caplog.at_level(logging.WARNING, logger="fireclay"):
        got = fireclay.compile(ours)(input_ids=ids, labels=labels).loss
        got.backward()
    _no_fallback(caplog)
    tolerance = 1e-5 if dtype == torch.float32 else 2e-2
    torch.testing.assert_close(got, want, atol=tolerance, rtol=tolerance)
    for (pname, p), q in zip(model.named_parameters(), ours.parameters()):
        scale = p.grad.float().abs().max().item() + 1e-6
        assert (q.grad.float() - p.grad.float()).abs().max().item() <= tolerance * 2 * scale, pname
