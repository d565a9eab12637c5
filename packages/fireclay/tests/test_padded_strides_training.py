"""A training step whose loss reads a language-model head's logits, with padded row strides forced
on for the CPU (fireclay_loops.layout.padded_strides, on for CUDA by default): the backward stores
the logits' gradient with padded rows for the head's two matmuls, and the loss, the logits (in
eager's strides) and every gradient match eager's."""

import torch

import fireclay

VOCAB = 1100  # float32 rows of 4400 bytes: padded to 1120 elements


def _loss(model, x, y):
    logits = model(x)
    return logits, torch.nn.functional.cross_entropy(logits.float(), y)


def test_training_step_with_padded_rows_matches_eager(tmp_path):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.GELU(), torch.nn.Linear(32, VOCAB))
    with fireclay.config.loops.patch(pad_strides=("cpu",)), fireclay.config.patch(compile_cache=False, debug_dir=str(tmp_path)):
        compiled = fireclay.compile(_loss)
        for seed in (1, 2):
            gen = torch.Generator().manual_seed(seed)
            x, y = torch.randn(24, 16, generator=gen), torch.randint(0, VOCAB, (24,), generator=gen)
            results = []
            for fn in (_loss, compiled):
                model.zero_grad()
                logits, loss = fn(model, x, y)
                loss.backward()
                results.append((logits, loss, [p.grad.clone() for p in model.parameters()]))
            (want_logits, want_loss, want_grads), (logits, loss, grads) = results
            assert logits.stride() == want_logits.stride()
            torch.testing.assert_close(logits, want_logits, atol=1e-5, rtol=1e-5)
            torch.testing.assert_close(loss, want_loss, atol=1e-5, rtol=1e-5)
            for g, w in zip(grads, want_grads):
                torch.testing.assert_close(g, w, atol=1e-5, rtol=1e-4)
    # the backward's schedule (in the debug folder): the logits' gradient, which our kernel
    # writes, is stored with padded rows, and both matmuls of the head read it so
    schedules = [p.read_text() for p in tmp_path.rglob("schedule.txt")]
    backward = [s for s in schedules if "in_tangent" in s]
    assert len(backward) == 1
    assert "1100; strides 1120, 1]" in backward[0] and "24; strides 1, 1120]" in backward[0], backward[0]
