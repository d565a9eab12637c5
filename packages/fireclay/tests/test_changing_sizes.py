"""Sizes that change between calls, through both front ends, in inference and in training.

With ``torch.compile(backend="fireclay")`` TorchDynamo captures the second size with dynamic
shapes: its graph then takes the size symbols (and ints that changed) as int inputs. Eager is
the oracle: outputs and gradients on fresh random inputs of each size, and no warning (a
warning here means a graph fell back to the interpreter or to TorchDynamo's own graph).
"""

import copy
import logging

import pytest
import torch
import torch.nn.functional as F

import fireclay


class Attention(torch.nn.Module):
    """A pre-norm causal self-attention block: batch and sequence length are the free sizes."""

    def __init__(self, width=16, heads=2):
        super().__init__()
        self.heads = heads
        self.norm = torch.nn.LayerNorm(width)
        self.qkv = torch.nn.Linear(width, 3 * width)
        self.out = torch.nn.Linear(width, width)

    def forward(self, x):
        b, t, c = x.shape
        q, k, v = (z.view(b, t, self.heads, c // self.heads).transpose(1, 2)
                   for z in self.qkv(self.norm(x)).split(c, dim=-1))
        a = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return x + self.out(a.transpose(1, 2).reshape(b, t, c))


def mlp():
    return torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.GELU(), torch.nn.Linear(16, 4))


def flattened(x):
    # Reads the size and computes with it: the graph holds int arithmetic on the symbol.
    return torch.tanh(x.view(x.size(0) * 2, -1)).sum(0) * x.shape[0]


def scaled(x, n):
    # ``n`` changes: TorchDynamo hands it over as an int input no tensor's size holds.
    return (x * n).relu() + n


def paired(x, y):
    # Two inputs sharing one symbol, and a second symbol of y's own.
    return x.sum(1) + y.amax(1)


def repeated(x, n):
    return x.repeat(n, 1).sin()


# name, model or function factory, inputs for size n, sizes (the second and later run dynamic)
CASES = [
    ("mlp", mlp, lambda n: (torch.randn(n, 8),), (3, 5, 7)),
    ("attention", Attention, lambda n: (torch.randn(2, n, 16),), (4, 6, 9)),
    ("flattened", lambda: flattened, lambda n: (torch.randn(n, 6),), (3, 5, 8)),
    ("scaled", lambda: scaled, lambda n: (torch.randn(3, 4), n), (3, 5, 8)),
    ("paired", lambda: paired, lambda n: (torch.randn(n, 3), torch.randn(n, n + 2)), (3, 5, 8)),
    ("repeated", lambda: repeated, lambda n: (torch.randn(3, 4), n), (2, 3, 5)),
]
FRONT_ENDS = ["torch.compile", "fireclay.compile"]


def _compiled(front_end, target):
    if front_end == "torch.compile":
        torch._dynamo.reset()  # baseline-ok: the test's front end, TorchDynamo, starts clean
        return torch.compile(target, backend="fireclay")
    return fireclay.compile(target)


def _grads(out, inputs, params):
    leaves = [x for x in inputs if isinstance(x, torch.Tensor)] + params
    return torch.autograd.grad(out.sum(), leaves)


@pytest.mark.parametrize("training", [False, True], ids=["inference", "training"])
@pytest.mark.parametrize("front_end", FRONT_ENDS)
@pytest.mark.parametrize("name, make, inputs, sizes", CASES, ids=[c[0] for c in CASES])
def test_changing_sizes_match_eager(name, make, inputs, sizes, front_end, training, caplog):
    torch.manual_seed(0)
    target = make()
    reference = copy.deepcopy(target) if isinstance(target, torch.nn.Module) else target
    compiled = _compiled(front_end, target)
    params = list(target.parameters()) if isinstance(target, torch.nn.Module) else []
    ref_params = list(reference.parameters()) if isinstance(reference, torch.nn.Module) else []
    with caplog.at_level(logging.WARNING):
        for n in sizes:
            args = inputs(n)
            args = tuple(x.requires_grad_(training) if isinstance(x, torch.Tensor) else x for x in args)
            ref_args = tuple(x.detach().requires_grad_(training) if isinstance(x, torch.Tensor) else x for x in args)
            with torch.set_grad_enabled(training):
                out, expected = compiled(*args), reference(*ref_args)
            torch.testing.assert_close(out, expected, rtol=1e-5, atol=1e-5)
            if training:
                for got, want in zip(_grads(out, args, params), _grads(expected, ref_args, ref_params)):
                    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5)
    problems = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert problems == [], problems


def test_a_negative_int_runs_as_torchdynamo_captured_it(caplog):
    """An int input becomes the length of a size-carrying tensor; a negative one cannot, and
    that call runs TorchDynamo's own graph (correct, not compiled by fireclay)."""
    compiled = _compiled("torch.compile", scaled)
    with caplog.at_level(logging.WARNING):
        for n in (3, 5, -4, 7):
            x = torch.randn(3, 4)
            torch.testing.assert_close(compiled(x, n), scaled(x, n))
    assert [r for r in caplog.records if r.levelno >= logging.WARNING] == []
