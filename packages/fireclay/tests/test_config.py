"""The typed config: defaults, environment overrides, patch as context manager and decorator."""

import os
import subprocess
import sys

import pytest

import fireclay
from fireclay.config import Config, reload_from_environment


def test_patch_restores_after_a_block_and_a_decorated_call():
    before = fireclay.config.recompile_limit
    with fireclay.config.patch(recompile_limit=3):
        assert fireclay.config.recompile_limit == 3
    assert fireclay.config.recompile_limit == before

    @fireclay.config.patch(verify_correctness=True)
    def inside():
        return fireclay.config.verify_correctness

    assert inside() is True and fireclay.config.verify_correctness is False


def test_unknown_knob_and_wrong_type_are_refused():
    with pytest.raises(AttributeError, match="no knob 'recompile_limt'.*recompile_limit"):
        fireclay.config.patch(recompile_limt=3)
    with pytest.raises(TypeError, match="expects int"):
        fireclay.config.recompile_limit = "many"
    with pytest.raises(TypeError, match="expects bool"):
        fireclay.config.verbose = 3


@pytest.mark.parametrize(
    "env, field, expected",
    [
        ("FIRECLAY_RECOMPILE_LIMIT", "recompile_limit", 2),
        ("FIRECLAY_VERIFY_CORRECTNESS", "verify_correctness", True),
        ("FIRECLAY_CACHE_DIR", "cache_dir", "/tmp/somewhere"),
        ("FIRECLAY_VERIFY_RTOL", "verify_rtol", 0.5),
    ],
)
def test_environment_overrides(monkeypatch, env, field, expected):
    monkeypatch.setenv(env, str(expected).lower() if isinstance(expected, bool) else str(expected))
    assert getattr(reload_from_environment(Config()), field) == expected


def test_bad_environment_value_names_the_variable(monkeypatch):
    monkeypatch.setenv("FIRECLAY_VERBOSE", "perhaps")
    with pytest.raises(ValueError, match="FIRECLAY_VERBOSE"):
        reload_from_environment(Config())


def test_environment_is_read_at_import():
    env = dict(os.environ, FIRECLAY_RECOMPILE_LIMIT="5")
    out = subprocess.run([sys.executable, "-c", "import fireclay; print(fireclay.config.recompile_limit)"],
                         env=env, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "5"


@pytest.mark.parametrize(("knob", "stage_knob", "value"), [
    ("recompile_limit", "recompile_limit", 2),
    ("automatic_dynamic_shapes", "automatic_dynamic", False),
    ("replay_side_effects", "replay_side_effects", False),
])
def test_capture_knobs_write_through_to_the_capture_stage(knob, stage_knob, value):
    import fireclay_capture

    with fireclay.config.patch(**{knob: value}):
        assert getattr(fireclay_capture.config, stage_knob) == value
    assert getattr(fireclay_capture.config, stage_knob) == getattr(fireclay.config, knob)


def test_replay_side_effects_off_breaks_the_graph_at_a_mutation():
    import torch

    log = []

    def fn(x):
        y = x.sin()
        log.append(1)
        return y.cos()

    for replay, graphs in ((True, 1), (False, 2)):
        with fireclay.config.patch(replay_side_effects=replay):
            report = fireclay.explain(fn)(torch.randn(3))
        assert report.graph_count == graphs, report


def test_verify_correctness_catches_a_wrong_backend():
    import torch

    from fireclay.verify import CorrectnessError

    def off_by_one(program, example_inputs):
        return lambda *inputs: [inputs[0] + 1]

    compiled = fireclay.compile(lambda x: x * 1, backend=off_by_one)
    compiled(torch.ones(2))  # not verified: wrong, silently
    with fireclay.config.patch(verify_correctness=True):
        compiled = fireclay.compile(lambda x: x * 1, backend=off_by_one)
        with pytest.raises(CorrectnessError, match="output 0"):
            compiled(torch.ones(2))
