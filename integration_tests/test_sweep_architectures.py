"""Architectures the transformers sweep (issue 20) found wrong or raising, run through the sweep's own
harness: built tiny from their default config, compared with eager on every output, TorchDynamo's
graph as the second reference where transformers takes another path under a compiler."""

from __future__ import annotations

import pytest

pytest.importorskip("transformers")

from benchmarks.sweep import architectures  # noqa: E402
from benchmarks.sweep_run import run_architecture  # noqa: E402

CLASSES = dict(architectures())


@pytest.mark.parametrize("model_type", ["paligemma", "vilt", "funnel", "tapas", "longformer"])
def test_architecture_is_right_or_wrong_only_as_torchdynamo(model_type):
    """PaliGemma without token_type_ids keeps its causal mask only under a compiler (transformers
    reads position ids in eager and drops it), so its result can only match TorchDynamo's; the
    others break the graph on data (vilt inside comprehensions, funnel on symbolic lengths, tapas
    and longformer on tensor-valued sizes) and must match eager."""
    outcome = run_architecture(model_type, CLASSES[model_type], device="cpu", dtype="float32", mode="inference",
                               dynamo=True)
    assert outcome.status in ("pass", "wrong"), (outcome.status, outcome.stage, outcome.reason, outcome.detail[-2000:])
    if outcome.status == "wrong":
        assert model_type == "paligemma" and outcome.same_as_dynamo, outcome.reason
    assert not outcome.interpreter_fallbacks or model_type == "funnel", outcome.warnings
