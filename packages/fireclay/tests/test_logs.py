"""Logging: FIRECLAY_LOG parsing, one logger per stage, stage packages' loggers forwarded."""

import logging
import os
import re
import subprocess
import sys

import pytest

from fireclay import logs

SPECS = [
    ("capture,loops=debug", {"capture": logging.INFO, "loops": logging.DEBUG}),
    ("+autograd", {"autograd": logging.DEBUG}),
    ("all=warning", {s: logging.WARNING for s in [*logs.STAGES, *logs.OWN, *logs.CHANNELS]}),
    ("recompiles,+guards", {"recompiles": logging.INFO, "guards": logging.DEBUG}),
    ("cache", {"cache": logging.INFO}),
    (" cpp = ERROR , triton ", {"cpp": logging.ERROR, "triton": logging.INFO}),
    ("", {}),
]


@pytest.mark.parametrize("spec, expected", SPECS)
def test_parse_spec(spec, expected):
    assert logs.parse_spec(spec) == (expected, [])


@pytest.mark.parametrize("spec, problem", [
    ("captur", "unknown stage or channel 'captur' (stages: capture, autograd, loops, cpp, triton, cache; channels: "
               "recompiles, graph_breaks, guards, output_code, perf_hints, stage_times; or all)"),
    ("loops=loud", "unknown level 'loud'"),
])
def test_parse_spec_reports_problems(spec, problem):
    levels, problems = logs.parse_spec(spec + ",cpp=debug")
    assert levels == {"cpp": logging.DEBUG}
    assert len(problems) == 1 and problem in problems[0]


@pytest.fixture()
def restore_loggers():
    names = [logs.ROOT, *(f"{logs.ROOT}.{s}" for s in logs.STAGES), *logs.STAGES.values(), *logs.OWN.values(),
             *logs.CHANNELS.values()]
    saved = {n: (logging.getLogger(n).level, list(logging.getLogger(n).handlers)) for n in names}
    yield
    for n, (level, handlers) in saved.items():
        logger = logging.getLogger(n)
        logger.setLevel(level)
        logger.handlers[:] = handlers


class Collect(logging.Handler):
    def __init__(self):
        super().__init__()
        self.records = []

    def emit(self, record):
        self.records.append(record)


@pytest.mark.parametrize("stage", list(logs.STAGES))
def test_package_logger_reaches_the_stage_logger_once(stage, restore_loggers):
    logs.set_levels({stage: logging.DEBUG}, stream=open(os.devnull, "w"))
    on_stage, on_fireclay = Collect(), Collect()
    logs.stage_logger(stage).addHandler(on_stage)
    logging.getLogger(logs.ROOT).addHandler(on_fireclay)
    logging.getLogger(logs.STAGES[stage]).debug("lowering %s", "x")
    logs.stage_logger(stage).info("direct")
    assert [r.getMessage() for r in on_stage.records] == ["lowering x", "direct"]
    assert [r.name for r in on_fireclay.records] == [f"fireclay.{stage}"] * 2
    logs.install()  # idempotent: still forwarded once
    logging.getLogger(logs.STAGES[stage]).debug("again")
    assert len(on_stage.records) == 3


def test_levels_leave_other_stages_quiet(restore_loggers):
    logs.set_levels({"loops": logging.DEBUG}, stream=open(os.devnull, "w"))
    seen = Collect()
    logging.getLogger(logs.ROOT).addHandler(seen)
    logging.getLogger("fireclay_loops").debug("yes")
    logging.getLogger("fireclay_cpp").debug("no")
    assert [r.getMessage() for r in seen.records] == ["yes"]


def test_environment_typo_warns_and_does_not_raise(restore_loggers):
    with pytest.warns(UserWarning, match="FIRECLAY_LOG='capture,loopz': ignored 'loopz': unknown stage"):
        levels = logs.configure("capture,loopz", source="FIRECLAY_LOG")
    assert levels == {"capture": logging.INFO}


def test_timed_logs_at_debug(restore_loggers):
    logs.set_levels({"cpp": logging.DEBUG}, stream=open(os.devnull, "w"))
    seen = Collect()
    logs.stage_logger("cpp").addHandler(seen)
    with logs.timed("cpp", "building kernels") as t:
        pass
    assert t["seconds"] >= 0 and seen.records[0].getMessage().startswith("building kernels took ")


def test_fireclay_log_turns_on_capture_output_in_a_new_process(tmp_path):
    script = tmp_path / "s.py"
    script.write_text(
        "import torch\n"
        "import fireclay.logs\n"
        "import fireclay\n"
        "def f(x):\n"
        "    print('side effect')\n"
        "    return x + 1\n"
        "fireclay.compile(f, backend='eager')(torch.ones(2))\n")
    env = dict(os.environ, FIRECLAY_LOG="capture")
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, env=env, timeout=240)
    assert done.returncode == 0, done.stderr
    # Depending on the capture version, the print() splits the frame or makes it run eagerly.
    assert re.search(r"^\[fireclay\.capture\] INFO: (graph break in f|running eagerly: fireclay_capture could not "
                     r"capture f)\b.*print\(\)", done.stderr, re.MULTILINE), done.stderr


def test_the_cache_logger_is_named_like_a_stage(restore_loggers, tmp_path):
    import torch

    import fireclay

    logs.set_levels({"cache": logging.INFO}, stream=open(os.devnull, "w"))
    seen = Collect()
    logging.getLogger(logs.ROOT).addHandler(seen)
    with fireclay.config.shared.patch(cache_dir=str(tmp_path)):
        f = fireclay.compile(lambda x: torch.tanh(x) * 3)
        x = torch.randn(4)
        with torch.no_grad():
            torch.testing.assert_close(f(x), torch.tanh(x) * 3)
    messages = [r.getMessage() for r in seen.records if r.name == "fireclay.cache"]
    assert [m.split(" (")[0] for m in messages] == ["compile cache: autograd inference artifact miss",
                                                    "compile cache: loops miss"]
