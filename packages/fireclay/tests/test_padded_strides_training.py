"""Training steps whose loss reads a language-model head's logits, with padded row strides (and
matmul padding) forced on for the CPU (both on for CUDA by default):

* with padded rows alone, the backward stores the logits' gradient with padded rows for the
  head's two matmuls;
* with matmul padding too, and an unaligned vocabulary, the backward's cross-entropy kernel writes
  the gradient into rows padded past the vocabulary, the input gradient's matmul reads it with K
  padded in place (zeros written beside it by a small kernel, no copy of the gradient), the weight
  gradient's matmul reads it transposed; the forward's matmul writes a product padded along N that
  the loss reads in the kernel restoring the returned logits' layout.

The loss, the logits (in eager's strides) and every gradient match eager's."""

import re

import torch

import fireclay

VOCAB = 1100  # float32 rows of 4400 bytes: padded to 1120 elements
UNALIGNED_VOCAB = 1031  # float32: K padded to 1032, rows of the gradient padded to 1056
TOKENS, WIDTH = 256, 256  # matmul padding's minimum sides


def _loss(model, x, y):
    logits = model(x)
    return logits, torch.nn.functional.cross_entropy(logits.float(), y)


def _check_step(compiled, model, x, y, atol: float) -> None:
    """One training step of ``compiled`` and of eager from the same gradients: equal results."""
    results = []
    for fn in (_loss, compiled):
        model.zero_grad()
        logits, loss = fn(model, x, y)
        loss.backward()
        results.append((logits, loss, [p.grad.clone() for p in model.parameters()]))
    (want_logits, want_loss, want_grads), (logits, loss, grads) = results
    assert logits.stride() == want_logits.stride()
    torch.testing.assert_close(logits, want_logits, atol=atol, rtol=1e-4 if atol > 1e-5 else 1e-5)
    torch.testing.assert_close(loss, want_loss, atol=1e-5, rtol=1e-5)
    for g, w in zip(grads, want_grads):
        torch.testing.assert_close(g, w, atol=atol, rtol=1e-4)


def test_training_step_with_padded_rows_matches_eager(tmp_path):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.GELU(), torch.nn.Linear(32, VOCAB))
    with fireclay.config.loops.patch(pad_strides=("cpu",)), fireclay.config.patch(compile_cache=False, debug_dir=str(tmp_path)):
        compiled = fireclay.compile(_loss)
        for seed in (1, 2):
            gen = torch.Generator().manual_seed(seed)
            x, y = torch.randn(24, 16, generator=gen), torch.randint(0, VOCAB, (24,), generator=gen)
            _check_step(compiled, model, x, y, atol=1e-5)
    # the backward's schedule (in the debug folder): the logits' gradient, which our kernel
    # writes, is stored with padded rows, and both matmuls of the head read it so
    schedules = [p.read_text() for p in tmp_path.rglob("schedule.txt")]
    backward = [s for s in schedules if "in_tangent" in s]
    assert len(backward) == 1
    assert "1100; strides 1120, 1]" in backward[0] and "24; strides 1, 1120]" in backward[0], backward[0]


def test_lm_head_training_step_pads_the_logits_gradient_in_place(tmp_path):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, WIDTH), torch.nn.GELU(), torch.nn.Linear(WIDTH, UNALIGNED_VOCAB, bias=False))
    with fireclay.config.loops.patch(pad_strides=("cpu",), pad_matmul=("cpu",)), \
            fireclay.config.patch(compile_cache=False, debug_dir=str(tmp_path)):
        compiled = fireclay.compile(_loss)
        gen = torch.Generator().manual_seed(1)
        x, y = torch.randn(TOKENS, 16, generator=gen), torch.randint(0, UNALIGNED_VOCAB, (TOKENS,), generator=gen)
        _check_step(compiled, model, x, y, atol=1e-4)
    schedules = [p.read_text() for p in tmp_path.rglob("schedule.txt")]
    (backward,) = [s for s in schedules if "in_tangent" in s]
    (forward,) = [s for s in schedules if "in_tangent" not in s]
    # the input gradient's matmul reads the gradient's buffer with K padded, the weight
    # gradient's the same buffer transposed, its M (1031 rows) padded by the same columns
    padded = re.search(r"mm\.default\((buf\d+)\[256, 1032; strides 1056, 1\]", backward)
    assert padded is not None, backward
    assert f"{padded.group(1)}[1032, 256; strides 1, 1056]" in backward, backward
    # no kernel walks the padded gradient (a copy would); one writes its pad: 256 rows x 1 zero
    assert "(x0 < 256, x1 < 1032)" not in backward, backward
    assert "def kernel" in backward and re.search(r"def kernel\d+\(x0 < 256\):", backward), backward
    # the forward: the loss reads the padded product in the kernel that copies out the logits
    product = re.search(r"(buf\d+) = extern aten::mm\.default\(.*\[256, 1032; strides 1, 256\]\)", forward)
    assert product is not None, forward
    readers = [k for k in forward.split("\ndef ")[1:] if f"load({product.group(1)}," in k]
    assert len(readers) == 1 and "reduction" in readers[0].splitlines()[0], forward
