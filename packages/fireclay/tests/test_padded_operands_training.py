"""A training step of a language-model head whose vocabulary is unaligned, with matmul padding and
padded row strides forced on for the CPU (both on for CUDA by default): the backward's
cross-entropy kernel writes the logits' gradient into rows padded past the vocabulary, the
input gradient's matmul reads it with K padded in place (zeros written beside it by a small
kernel, no copy of the gradient), the weight gradient's matmul reads it transposed; the
forward's matmul writes a product padded along N that the loss reads in the kernel restoring the
returned logits' layout. The loss, the logits and every gradient match eager's."""

import re

import torch

import fireclay

VOCAB = 1031  # float32: K padded to 1032, rows of the gradient padded to 1056
TOKENS, WIDTH = 256, 256  # the padding's minimum sides


def _loss(model, x, y):
    logits = model(x)
    return logits, torch.nn.functional.cross_entropy(logits.float(), y)


def test_lm_head_training_step_pads_the_logits_gradient_in_place(tmp_path):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, WIDTH), torch.nn.GELU(), torch.nn.Linear(WIDTH, VOCAB, bias=False))
    with fireclay.config.loops.patch(pad_strides=("cpu",), pad_matmul=("cpu",)), \
            fireclay.config.patch(compile_cache=False, debug_dir=str(tmp_path)):
        compiled = fireclay.compile(_loss)
        gen = torch.Generator().manual_seed(1)
        x, y = torch.randn(TOKENS, 16, generator=gen), torch.randint(0, VOCAB, (TOKENS,), generator=gen)
        results = []
        for fn in (_loss, compiled):
            model.zero_grad()
            logits, loss = fn(model, x, y)
            loss.backward()
            results.append((logits, loss, [p.grad.clone() for p in model.parameters()]))
        (want_logits, want_loss, want_grads), (logits, loss, grads) = results
        assert logits.stride() == want_logits.stride()
        torch.testing.assert_close(logits, want_logits, atol=1e-4, rtol=1e-4)
        torch.testing.assert_close(loss, want_loss, atol=1e-5, rtol=1e-5)
        for g, w in zip(grads, want_grads):
            torch.testing.assert_close(g, w, atol=1e-4, rtol=1e-4)
    schedules = [p.read_text() for p in tmp_path.rglob("schedule.txt")]
    (backward,) = [s for s in schedules if "in_tangent" in s]
    (forward,) = [s for s in schedules if "in_tangent" not in s]
    # the input gradient's matmul reads the gradient's buffer with K padded, the weight
    # gradient's the same buffer transposed
    padded = re.search(r"mm\.default\((buf\d+)\[256, 1032; strides 1056, 1\]", backward)
    assert padded is not None, backward
    assert f"{padded.group(1)}[1031, 256; strides 1, 1056]" in backward, backward
    # no kernel walks the padded gradient (a copy would); one writes its pad: 256 rows x 1 zero
    assert "(x0 < 256, x1 < 1032)" not in backward, backward
    assert "def kernel" in backward and re.search(r"def kernel\d+\(x0 < 256\):", backward), backward
    # the forward: the loss reads the padded product in the kernel that copies out the logits
    product = re.search(r"(buf\d+) = extern aten::mm\.default\(.*\[256, 1032; strides 1, 256\]\)", forward)
    assert product is not None, forward
    readers = [k for k in forward.split("\ndef ")[1:] if f"load({product.group(1)}," in k]
    assert len(readers) == 1 and "reduction" in readers[0].splitlines()[0], forward
