"""Hand-written models and micro-benchmarks: small, with no library beyond torch."""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from benchmarks.models.spec import BuiltModel, Inputs, ModelSpec


def _randn(seed: int, *shape: int) -> torch.Tensor:
    generator = torch.Generator().manual_seed(seed)
    return torch.randn(*shape, generator=generator)


class MLP(nn.Module):
    def __init__(self, width: int, depth: int, classes: int):
        super().__init__()
        layers: list[nn.Module] = []
        for _ in range(depth):
            layers += [nn.Linear(width, width), nn.GELU()]
        self.body = nn.Sequential(*layers)
        self.head = nn.Linear(width, classes)

    def forward(self, x):
        return self.head(self.body(x))


@dataclass(frozen=True)
class MLPSize:
    width: int
    depth: int
    batch: int


MLP_SIZES = {
    "small": MLPSize(width=256, depth=4, batch=64),
    "medium": MLPSize(width=1024, depth=4, batch=256),
    "large": MLPSize(width=2048, depth=8, batch=512),
}


def _mlp(preset: str) -> BuiltModel:
    size = MLP_SIZES[preset]
    model = MLP(size.width, size.depth, 10)
    return BuiltModel(model, lambda seed, tiny: Inputs((_randn(seed, 1 if tiny else size.batch, size.width),)))


class ConvBNNet(nn.Module):
    """A small VGG-like CNN: conv / batch norm / ReLU stages, pooling, a linear classifier."""

    def __init__(self, channels: tuple[int, ...], classes: int):
        super().__init__()
        stages: list[nn.Module] = []
        previous = 3
        for width in channels:
            stages += [nn.Conv2d(previous, width, 3, padding=1, bias=False), nn.BatchNorm2d(width),
                       nn.ReLU(), nn.MaxPool2d(2)]
            previous = width
        self.features = nn.Sequential(*stages)
        self.classifier = nn.Linear(previous, classes)

    def forward(self, x):
        return self.classifier(torch.flatten(F.adaptive_avg_pool2d(self.features(x), 1), 1))


@dataclass(frozen=True)
class CNNSize:
    channels: tuple[int, ...]  # one conv stage per entry, each halving the image side
    batch: int
    image: int  # square image side


CNN_SIZES = {
    "small": CNNSize(channels=(16, 32, 64), batch=8, image=32),
    "medium": CNNSize(channels=(32, 64, 128, 256), batch=16, image=64),
    "large": CNNSize(channels=(64, 128, 256, 512), batch=64, image=128),
}


def _cnn_bn(preset: str) -> BuiltModel:
    size = CNN_SIZES[preset]
    model = ConvBNNet(size.channels, 10)
    return BuiltModel(model, lambda seed, tiny: Inputs((_randn(seed, 1 if tiny else size.batch, 3, size.image,
                                                               size.image),)))


class TransformerBlock(nn.Module):
    """A pre-norm decoder block: causal multi-head attention and a GELU MLP, both residual."""

    def __init__(self, hidden: int, heads: int):
        super().__init__()
        self.heads = heads
        self.norm1 = nn.LayerNorm(hidden)
        self.qkv = nn.Linear(hidden, 3 * hidden)
        self.proj = nn.Linear(hidden, hidden)
        self.norm2 = nn.LayerNorm(hidden)
        self.fc1 = nn.Linear(hidden, 4 * hidden)
        self.fc2 = nn.Linear(4 * hidden, hidden)

    def forward(self, x):
        batch, seq, hidden = x.shape
        q, k, v = self.qkv(self.norm1(x)).split(hidden, dim=-1)
        q, k, v = (t.view(batch, seq, self.heads, hidden // self.heads).transpose(1, 2) for t in (q, k, v))
        attention = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(attention.transpose(1, 2).reshape(batch, seq, hidden))
        return x + self.fc2(F.gelu(self.fc1(self.norm2(x))))


@dataclass(frozen=True)
class BlockSize:
    hidden: int
    heads: int
    batch: int
    seq: int


BLOCK_SIZES = {
    "small": BlockSize(hidden=128, heads=4, batch=4, seq=64),
    "medium": BlockSize(hidden=512, heads=8, batch=4, seq=128),
    "large": BlockSize(hidden=1024, heads=16, batch=16, seq=512),
}


def _transformer_block(preset: str) -> BuiltModel:
    size = BLOCK_SIZES[preset]
    model = TransformerBlock(size.hidden, size.heads)
    return BuiltModel(model, lambda seed, tiny: Inputs((_randn(seed, 1 if tiny else size.batch,
                                                               4 if tiny else size.seq, size.hidden),)))


class LayerNormOnly(nn.Module):
    def __init__(self, hidden: int):
        super().__init__()
        self.norm = nn.LayerNorm(hidden)

    def forward(self, x):
        return self.norm(x)


@dataclass(frozen=True)
class RowsSize:
    """A (rows, hidden) activation: what the row-wise micro-benchmarks run over."""

    rows: int
    hidden: int


ROWS_SIZES = {
    "small": RowsSize(rows=4096, hidden=256),
    "medium": RowsSize(rows=16384, hidden=512),
    "large": RowsSize(rows=65536, hidden=1024),
}


def _layernorm(preset: str) -> BuiltModel:
    size = ROWS_SIZES[preset]
    return BuiltModel(LayerNormOnly(size.hidden),
                      lambda seed, tiny: Inputs((_randn(seed, 8 if tiny else size.rows, size.hidden),)))


class ScaledSoftmax(nn.Module):
    """softmax(x * scale) over the last dim: attention-score shaped; the scale gives it a parameter."""

    def __init__(self):
        super().__init__()
        self.scale = nn.Parameter(torch.tensor(0.125))

    def forward(self, x):
        return torch.softmax(x * self.scale, dim=-1)


@dataclass(frozen=True)
class ScoresSize:
    """Attention scores: (heads, seq, seq)."""

    heads: int
    seq: int


SCORES_SIZES = {
    "small": ScoresSize(heads=16, seq=128),
    "medium": ScoresSize(heads=64, seq=512),
    "large": ScoresSize(heads=256, seq=1024),
}


def _softmax(preset: str) -> BuiltModel:
    size = SCORES_SIZES[preset]
    return BuiltModel(ScaledSoftmax(),
                      lambda seed, tiny: Inputs((_randn(seed, 1 if tiny else size.heads, 8 if tiny else size.seq,
                                                        8 if tiny else size.seq),)))


class PointwiseChain(nn.Module):
    """A bias-GELU-residual-dropout-free chain of pointwise ops: what fusion should make one kernel."""

    def __init__(self, hidden: int):
        super().__init__()
        self.bias = nn.Parameter(torch.randn(hidden) * 0.1)
        self.gate = nn.Parameter(torch.ones(hidden))

    def forward(self, x, residual):
        y = F.gelu(x + self.bias) * self.gate
        return torch.tanh(y + residual) * 0.5 + torch.sigmoid(residual) * 0.5


# Medium has half the layer norm's rows: three transcendental functions per element cost more.
POINTWISE_SIZES = {
    "small": RowsSize(rows=4096, hidden=256),
    "medium": RowsSize(rows=8192, hidden=512),
    "large": RowsSize(rows=65536, hidden=1024),
}


def _pointwise(preset: str) -> BuiltModel:
    size = POINTWISE_SIZES[preset]

    def inputs(seed: int, tiny: bool) -> Inputs:
        count = 8 if tiny else size.rows
        return Inputs((_randn(seed, count, size.hidden), _randn(seed + 1, count, size.hidden)))

    return BuiltModel(PointwiseChain(size.hidden), inputs)


MODELS = [
    ModelSpec("mlp", "hand-written", _mlp, description="4 Linear+GELU layers and a head"),
    ModelSpec("cnn_bn", "hand-written", _cnn_bn, description="conv/BatchNorm/ReLU/pool stages, linear head"),
    ModelSpec("transformer_block", "hand-written", _transformer_block,
              description="pre-norm causal attention (SDPA) + GELU MLP"),
    ModelSpec("layernorm", "micro", _layernorm, description="nn.LayerNorm over rows"),
    ModelSpec("softmax", "micro", _softmax, description="softmax(x * scale) over attention-shaped scores"),
    ModelSpec("pointwise_chain", "micro", _pointwise, description="bias, GELU, tanh, sigmoid: one fusable chain"),
]
