"""nn.Module: attribute access, parameters and buffers lifted, submodules inlined, ModuleList /
ModuleDict / Sequential iteration, the training flag, common layers."""

import torch
import torch.nn as nn
import torch.nn.functional as F

from corpus import Registry, T

CASES = Registry("modules")

torch.manual_seed(0)


class MLP(nn.Module):
    def __init__(self, d=8, hidden=16, act=F.gelu):
        super().__init__()
        self.fc1 = nn.Linear(d, hidden)
        self.fc2 = nn.Linear(hidden, d)
        self.act = act

    def forward(self, x):
        return self.fc2(self.act(self.fc1(x)))


class Residual(nn.Module):
    def __init__(self, inner):
        super().__init__()
        self.inner = inner
        self.norm = nn.LayerNorm(8)

    def forward(self, x):
        return x + self.inner(self.norm(x))


class Stack(nn.Module):
    def __init__(self, n=3):
        super().__init__()
        self.layers = nn.ModuleList([Residual(MLP()) for _ in range(n)])
        self.scale = 0.5

    def forward(self, x):
        for i, layer in enumerate(self.layers):
            x = layer(x) * self.scale if i % 2 else layer(x)
        return x


class Heads(nn.Module):
    def __init__(self):
        super().__init__()
        self.heads = nn.ModuleDict({"cls": nn.Linear(8, 3), "reg": nn.Linear(8, 1)})

    def forward(self, x):
        out = {name: head(x) for name, head in self.heads.items()}
        out["sum"] = self.heads["cls"](x).sum(-1) + self.heads.reg(x).squeeze(-1)
        return out


class WithBuffer(nn.Module):
    def __init__(self):
        super().__init__()
        self.register_buffer("mean", torch.randn(8))
        self.weight = nn.Parameter(torch.randn(8))

    def forward(self, x):
        return (x - self.mean) * self.weight


class TrainingFlag(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(8, 8)

    def forward(self, x):
        if self.training:
            return self.lin(x) * 2
        return self.lin(x)


class NoBias(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(8, 4, bias=False)

    def forward(self, x):
        if self.lin.bias is None:
            return self.lin(x)
        return self.lin(x) + 1


class ParamLoop(nn.Module):
    def __init__(self):
        super().__init__()
        self.a = nn.Linear(8, 8)
        self.b = nn.Linear(8, 8)

    def forward(self, x):
        reg = sum(p.pow(2).sum() for p in self.parameters())
        names = [n for n, _ in self.named_parameters()]
        return self.b(self.a(x)), reg, names


class ConvNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 8, 3, padding=1)
        self.bn = nn.BatchNorm2d(8)
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(8, 5)

    def forward(self, x):
        x = F.relu(self.bn(self.conv(x)))
        return self.fc(torch.flatten(self.pool(x), 1))


class SharedModule(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(8, 8)
        self.again = self.lin

    def forward(self, x):
        return self.again(self.lin(x))


class CallsHelperMethod(nn.Module):
    def __init__(self):
        super().__init__()
        self.proj = nn.Linear(8, 8)
        self.config = {"eps": 1e-6, "use_norm": True}

    def _norm(self, x):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.config["eps"])

    def forward(self, x, *, scale: float = 1.0):
        h = self.proj(x)
        if self.config["use_norm"]:
            h = self._norm(h)
        return h * scale


class Embed(nn.Module):
    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(20, 8)
        self.pos = nn.Parameter(torch.zeros(1, 6, 8))
        self.drop = nn.Dropout(0.1)

    def forward(self, ids):
        return self.drop(self.emb(ids) + self.pos[:, : ids.shape[1]])


class MultiInputOutput(nn.Module):
    def __init__(self):
        super().__init__()
        self.a = nn.Linear(8, 4)

    def forward(self, x, y, mask=None):
        h = self.a(x) + self.a(y)
        if mask is not None:
            h = h.masked_fill(mask, 0.0)
        return h, (h.sum(), [h.mean()])


class SequentialModel(nn.Sequential):
    pass


def _register(name, module, inputs, **options):
    module.eval()
    CASES.add(name, module, inputs, **options)


x8 = lambda: (T(2, 8),)
_register("mlp", MLP(), x8)
_register("mlp_relu_attr", MLP(act=torch.relu), x8)
_register("residual", Residual(MLP()), lambda: (T(2, 5, 8),))
_register("module_list_stack", Stack(), x8)
_register("module_dict_heads", Heads(), x8)
_register("buffer_and_parameter", WithBuffer(), x8)
_register("training_flag_eval", TrainingFlag(), x8)
_register("bias_none_attribute", NoBias(), x8)
_register("parameters_loop", ParamLoop(), x8)
_register("conv_bn_pool", ConvNet(), lambda: (T(2, 3, 8, 8),))
_register("shared_submodule", SharedModule(), x8)
_register("helper_method_and_kwonly", CallsHelperMethod(), x8)
_register("embedding_dropout_eval", Embed(), lambda: (torch.randint(0, 20, (2, 5)),))
_register("multi_input_output", MultiInputOutput(), lambda: (T(2, 8), T(2, 8)))
_register("multi_input_with_mask", MultiInputOutput(),
          lambda: (T(2, 8), T(2, 8), torch.rand(2, 4) > 0.5))
_register("sequential", nn.Sequential(nn.Linear(8, 8), nn.ReLU(), nn.Linear(8, 2)), x8)
_register("sequential_subclass", SequentialModel(nn.Linear(8, 8), nn.Tanh()), x8)
_register("layers_gelu_silu", nn.Sequential(nn.GELU(), nn.SiLU(), nn.Softmax(-1)), x8)
_register("layernorm_groupnorm", nn.Sequential(nn.LayerNorm(8)), x8)
_register("conv1d", nn.Conv1d(4, 6, 3), lambda: (T(2, 4, 10),))
_register("batchnorm1d_eval", nn.BatchNorm1d(8), x8)
_register("groupnorm", nn.GroupNorm(2, 4), lambda: (T(2, 4, 5),))
_register("maxpool_flatten", nn.Sequential(nn.MaxPool2d(2), nn.Flatten()), lambda: (T(2, 3, 4, 4),))
_register("identity", nn.Identity(), x8)
