"""Training steps through compiled programs equal eager's: same parameters and buffers after
three optimizer steps."""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.functional as F
from fx_programs import BatchNorm2d, program_from

from fireclay_autograd import compile_program


class MLP(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = torch.nn.Linear(12, 32)
        self.norm = torch.nn.LayerNorm(32)
        self.fc2 = torch.nn.Linear(32, 32)
        self.head = torch.nn.Linear(32, 5)

    def forward(self, x):
        h = F.gelu(self.fc1(x))
        h = self.norm(h)
        h = h + torch.tanh(self.fc2(h))
        return self.head(h)


class CNN(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.conv1 = torch.nn.Conv2d(3, 8, 3, padding=1, bias=False)
        self.bn1 = BatchNorm2d(8)
        self.conv2 = torch.nn.Conv2d(8, 8, 3, padding=1, bias=False)
        self.bn2 = BatchNorm2d(8)
        self.fc = torch.nn.Linear(8, 4)

    def forward(self, x):
        h = F.relu(self.bn1(self.conv1(x)))
        h = F.max_pool2d(h, 2)
        h = F.relu(self.bn2(self.conv2(h)) + h)
        h = F.adaptive_avg_pool2d(h, 1).flatten(1)
        return self.fc(h)


def _train(model, step_fn, batches, opt_name):
    opt = (torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9) if opt_name == "sgd"
           else torch.optim.Adam(model.parameters(), lr=1e-2))
    losses = []
    for x, t in batches:
        opt.zero_grad()
        loss = F.cross_entropy(step_fn(x), t)
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses


@pytest.mark.parametrize("opt_name", ["sgd", "adam"])
@pytest.mark.parametrize("model_cls,shape", [(MLP, (8, 12)), (CNN, (4, 3, 8, 8))], ids=["mlp", "cnn_batchnorm"])
def test_three_training_steps_match_eager(model_cls, shape, opt_name):
    torch.manual_seed(0)
    ours = model_cls()
    eager = copy.deepcopy(ours)
    n_classes = 5 if model_cls is MLP else 4
    batches = [(torch.randn(*shape), torch.randint(0, n_classes, (shape[0],))) for _ in range(3)]
    buffers_before = {k: v.clone() for k, v in eager.named_buffers()}
    compiled = compile_program(program_from(ours, [batches[0][0]]), [batches[0][0]])
    # torch.fx tracing runs num_batches_tracked.add_ once; undo it so buffers start equal.
    for k, v in ours.named_buffers():
        v.copy_(buffers_before[k])

    our_losses = _train(ours, lambda x: compiled(x)[0], batches, opt_name)
    eager_losses = _train(eager, eager, batches, opt_name)

    assert our_losses == pytest.approx(eager_losses, rel=1e-4, abs=1e-5)
    for (name, p), (_, q) in zip(ours.named_parameters(), eager.named_parameters()):
        torch.testing.assert_close(p, q, atol=1e-4, rtol=1e-4, msg=lambda m, name=name: f"{name}: {m}")
    for (name, b), (_, c) in zip(ours.named_buffers(), eager.named_buffers()):
        if "num_batches_tracked" in name:
            continue  # torch.fx cannot record this buffer's add_ (it runs at trace time)
        torch.testing.assert_close(b, c, atol=1e-5, rtol=1e-5, msg=lambda m, name=name: f"{name}: {m}")


def test_eval_mode_after_training_uses_inference_path():
    torch.manual_seed(1)
    model = MLP()
    x = torch.randn(4, 12)
    compiled = compile_program(program_from(model, [x]), [x])
    with torch.no_grad():
        torch.testing.assert_close(compiled(x)[0], model(x))
    assert compiled._training is None and compiled._inference is not None
    out = compiled(x)[0]
    assert out.requires_grad
    assert compiled._training is not None
