"""The typed config: defaults, environment overrides, patch as context manager and decorator."""

import os
import subprocess
import sys

import pytest

import fireclay
from fireclay.config import Config


def test_patch_restores_after_a_block_and_a_decorated_call():
    before = fireclay.config.capture.recompile_limit
    with fireclay.config.capture.patch(recompile_limit=3):
        assert fireclay.config.capture.recompile_limit == 3
    assert fireclay.config.capture.recompile_limit == before

    @fireclay.config.patch(verify_correctness=True)
    def inside():
        return fireclay.config.verify_correctness

    assert inside() is True and fireclay.config.verify_correctness is False


def test_unknown_knob_and_wrong_type_are_refused():
    with pytest.raises(AttributeError, match="no setting 'verify_correctnes'.*verify_correctness"):
        fireclay.config.patch(verify_correctnes=True)
    with pytest.raises(AttributeError, match="fireclay.config.capture.recompile_limit"):
        fireclay.config.recompile_limit = 3
    with pytest.raises(TypeError, match="expects int"):
        fireclay.config.capture.recompile_limit = "many"
    with pytest.raises(TypeError, match="expects bool"):
        fireclay.config.verbose = 3


@pytest.mark.parametrize(
    "section, env, field, expected",
    [
        ("capture", "FIRECLAY_CAPTURE_RECOMPILE_LIMIT", "recompile_limit", 2),
        ("", "FIRECLAY_VERIFY_CORRECTNESS", "verify_correctness", True),
        ("shared", "FIRECLAY_CACHE_DIR", "cache_dir", "/tmp/somewhere"),
        ("", "FIRECLAY_VERIFY_RTOL", "verify_rtol", 0.5),
    ],
)
def test_environment_overrides(monkeypatch, section, env, field, expected):
    settings = getattr(fireclay.config, section) if section else fireclay.config
    monkeypatch.setenv(env, str(expected).lower() if isinstance(expected, bool) else str(expected))
    assert getattr(type(settings).from_environment(), field) == expected


def test_bad_environment_value_names_the_variable(monkeypatch):
    monkeypatch.setenv("FIRECLAY_VERBOSE", "perhaps")
    with pytest.raises(ValueError, match="FIRECLAY_VERBOSE"):
        Config.from_environment()


def test_environment_is_read_at_import():
    env = dict(os.environ, FIRECLAY_CAPTURE_RECOMPILE_LIMIT="5")
    out = subprocess.run([sys.executable, "-c", "import fireclay; print(fireclay.config.capture.recompile_limit)"],
                         env=env, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "5"


@pytest.mark.parametrize("section, package", [("shared", "fireclay_ir"), ("capture", "fireclay_capture"),
                                              ("loops", "fireclay_loops"), ("cpp", "fireclay_cpp")])
def test_each_section_is_the_stages_own_config(section, package):
    import importlib

    stage = importlib.import_module(package)
    assert getattr(fireclay.config, section) is stage.config


def test_replay_side_effects_off_breaks_the_graph_at_a_mutation():
    import torch

    log = []

    def fn(x):
        y = x.sin()
        log.append(1)
        return y.cos()

    for replay, graphs in ((True, 1), (False, 2)):
        with fireclay.config.capture.patch(replay_side_effects=replay):
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
