"""Convolution networks through the whole pipeline, where fireclay-loops keeps activations
channels-last on the CPU: outputs, gradients, parameters and BatchNorm statistics match eager in
value and in strides (eager's NCHW layouts, whatever the compiled program used inside), and the
saved activations cross from the compiled forward to the compiled backward channels-last."""

import copy

import pytest
import torch

import fireclay


class ResidualCNN(torch.nn.Module):
    """conv/BN/ReLU, a strided and a grouped conv, a 1x1 residual branch, pooling, a linear head."""

    def __init__(self):
        super().__init__()
        self.stem = torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3, padding=1, bias=False), torch.nn.BatchNorm2d(8),
                                        torch.nn.ReLU(), torch.nn.MaxPool2d(2))
        self.down = torch.nn.Conv2d(8, 16, 3, stride=2, padding=1)
        self.grouped = torch.nn.Conv2d(16, 16, 3, padding=1, groups=4)
        self.skip = torch.nn.Conv2d(16, 16, 1)
        self.bn = torch.nn.BatchNorm2d(16)
        self.head = torch.nn.Linear(16, 5)

    def forward(self, x):
        y = torch.relu(self.down(self.stem(x)))
        y = torch.relu(self.bn(self.grouped(y)) + self.skip(y))
        return self.head(torch.nn.functional.adaptive_avg_pool2d(y, 1).flatten(1)), y


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=["float32", "float64"])
@pytest.mark.parametrize("train", [False, True], ids=["inference", "training"])
def test_cnn_matches_eager_in_values_and_strides(train, dtype):
    torch.manual_seed(0)
    model = ResidualCNN().to(dtype).train(train)
    reference = copy.deepcopy(model)
    compiled = fireclay.compile(model, backend="fireclay", fullgraph=True)
    tol = {"rtol": 1e-4, "atol": 1e-4} if dtype == torch.float32 else {"rtol": 1e-9, "atol": 1e-9}
    for _ in range(2):
        x = torch.randn(4, 3, 16, 16, dtype=dtype)
        with torch.set_grad_enabled(train):
            got, want = compiled(x), reference(x)
        for g, w in zip(got, want):
            torch.testing.assert_close(g, w, **tol)
            assert g.stride() == w.stride()
        if not train:
            continue
        (got[0].pow(2).mean() + got[1].mean()).backward()
        (want[0].pow(2).mean() + want[1].mean()).backward()
        for (name, p), q in zip(model.named_parameters(), reference.parameters()):
            torch.testing.assert_close(p.grad, q.grad, **tol, msg=name)
            assert p.grad.stride() == q.grad.stride(), name
            p.grad = q.grad = None
        for (name, b), c in zip(model.named_buffers(), reference.buffers()):
            torch.testing.assert_close(b, c, **tol, msg=name)


def test_saved_activations_reach_the_backward_channels_last(monkeypatch):
    """The forward returns the activations it saves in the layout it computed them in, and the
    backward is compiled for that layout: no input of either half is copied at its door."""
    import fireclay_cpp
    import fireclay_cpp.runtime

    compiled, copied = [], []
    compile_program, as_base = fireclay_cpp.compile_program, fireclay_cpp.runtime.as_base

    def recording(program, *args, **kwargs):
        out = compile_program(program, *args, **kwargs)
        compiled.append(out)
        return out

    def counting(t, name, *args):
        out = as_base(t, name, *args)
        if out is not t:
            copied.append(name)
        return out

    monkeypatch.setattr(fireclay_cpp, "compile_program", recording)
    monkeypatch.setattr(fireclay_cpp.runtime, "as_base", counting)
    torch.manual_seed(0)
    model = ResidualCNN().train()
    step = fireclay.compile(model, backend="fireclay", fullgraph=True)
    for _ in range(2):
        out, y = step(torch.randn(4, 3, 16, 16))
        (out.pow(2).mean() + y.mean()).backward()
    assert len(compiled) == 2 and copied == []
    backward = compiled[1].scheduled.program
    inputs = [backward.buffers[i] for i in backward.inputs]
    channels_last = [b for b in inputs if len(b.size) == 4 and b.stride[1] == 1 and b.size[1] != 1]
    assert len(channels_last) >= 4  # the saved activations of the convolutions and batch norms
