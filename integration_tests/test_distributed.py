"""Compiled models under torch.distributed (gloo, CPU, 2 processes): DDP in both wrapping orders,
with and without ``config.optimize_ddp``, and FSDP2's per-block and whole-model patterns. Each
case trains 5 SGD steps on inputs that differ per rank; the compiled parameters must equal eager
DDP's / FSDP2's. One spawn runs every case (the worker is distributed_cases.worker)."""

from __future__ import annotations

import json
import os

import pytest

torch = pytest.importorskip("torch")
dist = pytest.importorskip("torch.distributed")
if not dist.is_available() or not dist.is_gloo_available():
    pytest.skip("torch.distributed with gloo is not available", allow_module_level=True)

from distributed_cases import Case, worker  # noqa: E402

WORLD_SIZE = 2

CASES = [
    Case(name="mlp-compile(ddp)", model="mlp", wrap="compile(ddp)"),
    Case(name="mlp-ddp(compile)", model="mlp", wrap="ddp(compile)"),
    Case(name="mlp-compile(ddp)-unsplit", model="mlp", wrap="compile(ddp)", optimize_ddp=False),
    Case(name="mlp-compile(ddp)-fireclay", model="mlp", wrap="compile(ddp)", backend="fireclay"),
    Case(name="transformer-compile(ddp)", model="transformer", wrap="compile(ddp)"),
    Case(name="transformer-ddp(compile)", model="transformer", wrap="ddp(compile)"),
    Case(name="transformer-fsdp2-blocks", model="transformer", wrap="fsdp2-blocks"),
    Case(name="transformer-fsdp2-whole", model="transformer", wrap="fsdp2-whole"),
    Case(name="mlp-fsdp2-blocks", model="mlp", wrap="fsdp2-blocks"),
    Case(name="mlp-dtensor-parameters", model="mlp", wrap="dtensor"),
]
BY_NAME = {c.name: c for c in CASES}


@pytest.fixture(scope="module")
def outcomes(tmp_path_factory):
    import dataclasses

    import torch.multiprocessing as mp

    folder = tmp_path_factory.mktemp("gloo")
    mp.spawn(worker, args=(WORLD_SIZE, str(folder / "init"), [dataclasses.asdict(c) for c in CASES], str(folder)),
             nprocs=WORLD_SIZE, join=True)
    results = []
    for rank in range(WORLD_SIZE):
        with open(os.path.join(folder, f"rank{rank}.json")) as f:
            results.append({r["name"]: r for r in json.load(f)})
    return results


@pytest.mark.parametrize("name", list(BY_NAME))
def test_compiled_training_matches_eager(outcomes, name):
    for rank, by_name in enumerate(outcomes):
        outcome = by_name[name]
        assert not outcome["error"], f"rank {rank}: {outcome['error']}"
        assert outcome["max_difference"] <= 1e-5, f"rank {rank}: parameters differ by {outcome['max_difference']}"


@pytest.mark.parametrize("name", ["mlp-compile(ddp)", "mlp-ddp(compile)", "transformer-compile(ddp)",
                                  "transformer-ddp(compile)", "mlp-compile(ddp)-fireclay"])
def test_optimize_ddp_splits_at_buckets_so_gradients_are_ready_early(outcomes, name):
    outcome = outcomes[0][name]
    # Tiny buckets (bucket_cap_mb=0.002): one piece per bucket, compiled separately, so the last
    # pieces' parameter gradients (DDP's reducer hooks) are ready before the backward reaches
    # the input.
    assert outcome["graphs_compiled"] >= 3
    assert outcome["grads_ready_before_input"] >= 2


def test_without_optimize_ddp_the_graph_is_one_piece(outcomes):
    outcome = outcomes[0]["mlp-compile(ddp)-unsplit"]
    assert outcome["graphs_compiled"] == 1
    assert outcome["grads_ready_before_input"] == 0


@pytest.mark.parametrize("name", ["transformer-fsdp2-blocks", "transformer-fsdp2-whole", "mlp-fsdp2-blocks"])
def test_fsdp2_blocks_are_compiled(outcomes, name):
    # FSDP2's hooks gather the parameters into plain tensors around the compiled forward.
    assert outcomes[0][name]["graphs_compiled"] >= 1
    assert outcomes[0][name]["warnings"] == []


def test_dtensor_parameters_fall_back_with_one_warning(outcomes):
    outcome = outcomes[0]["mlp-dtensor-parameters"]
    assert outcome["graphs_compiled"] == 0
    # Five steps, one notice (fireclay's fallback notices are once per place).
    assert len(outcome["warnings"]) == 1 and "DTensor" in outcome["warnings"][0]
