"""The benchmark suite's size presets: every size table names every preset, and the medium models
build and run in eager (test_model_suite checks the small ones in depth; large is for GPUs)."""

from __future__ import annotations

import pytest
import torch

from benchmarks.measure import eager_outputs, output_tensors
from benchmarks.models import PRESETS, all_models, handwritten, hf, zoo

SPECS = list(all_models().values())


def _size_tables():
    for module in (handwritten, hf, zoo):
        for name, value in vars(module).items():
            if isinstance(value, dict) and set(value) & set(PRESETS):
                yield pytest.param(value, id=f"{module.__name__.rsplit('.', 1)[-1]}.{name}")


@pytest.mark.parametrize("table", list(_size_tables()))
def test_every_size_table_has_every_preset(table):
    # A table missing a preset would fail only when someone builds that model at that preset.
    assert list(table) == list(PRESETS)


def test_presets_are_small_medium_large():
    assert PRESETS == ("small", "medium", "large")


def _numel(inputs) -> int:
    return sum(t.numel() for t in (*inputs.args, *inputs.kwargs.values()) if isinstance(t, torch.Tensor))


@pytest.mark.parametrize("spec", SPECS, ids=[spec.name for spec in SPECS])
def test_medium_model_runs_in_eager(spec):
    if spec.missing():
        pytest.skip(f"needs {', '.join(spec.missing())}")
    built = spec.build("medium")
    inputs = built.inputs(1)
    outputs = eager_outputs(built, seed=1)
    assert outputs, f"{spec.name} returned no tensor"
    assert all(torch.isfinite(t).all() for t in outputs if t.is_floating_point())
    # Medium sits above small: larger inputs, no fewer parameters (the micro-benchmarks have none
    # or a handful), and still a CPU-sized model.
    small = spec.build("small")
    assert _numel(inputs) > _numel(small.inputs(1))
    parameters = sum(p.numel() for p in built.module.parameters())
    assert sum(p.numel() for p in small.module.parameters()) <= parameters < 30_000_000
    # Tiny calls stay tiny at every preset: they measure per-call overhead.
    tiny = built.inputs(1, tiny=True)
    with torch.no_grad():
        assert output_tensors(built.module(*tiny.args, **tiny.kwargs))
