"""What a user reaches for: torch.compile parity (mode/options through the entry point,
set_stance, arguments checked at the call), the FIRECLAY_LOG channels, debug_dir, verbose,
progress on a terminal, and an import light enough for the CLI."""

import logging
import os
import subprocess
import sys
import time

import pytest
import torch

import fireclay
from fireclay import logs, stages
from fireclay.backends import builtin


def _mlp():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(5, 7), torch.nn.GELU(), torch.nn.Linear(7, 3))


@pytest.fixture(autouse=True)
def _fresh():
    torch._dynamo.reset()
    fireclay.set_stance("default")
    yield
    fireclay.set_stance("default")
    torch._dynamo.reset()


@pytest.mark.parametrize("kwargs, expected", [
    ({}, fireclay.list_mode_options("default")),
    ({"mode": "max-autotune"}, fireclay.list_mode_options("max-autotune")),
    ({"mode": "reduce-overhead"}, fireclay.list_mode_options("reduce-overhead")),
    ({"options": {"max_autotune": True}}, {"cudagraphs": False, "max_autotune": True}),
    ({"options": {"triton.cudagraphs": True}}, {"cudagraphs": True, "max_autotune": False}),
])
def test_torch_compile_takes_mode_and_options(kwargs, expected, monkeypatch):
    seen = []
    real = builtin._codegen_compiler

    def spy(program, example_inputs, options=None, artifacts=None, **rest):
        seen.append(dict(options or {}))
        return real(program, example_inputs, options, artifacts, **rest)

    monkeypatch.setattr(builtin, "_codegen_compiler", spy)
    model = _mlp()
    compiled = torch.compile(model, backend="fireclay", **kwargs)
    x = torch.randn(2, 5, requires_grad=True)
    out = compiled(x)
    torch.testing.assert_close(out, model(x))
    out.sum().backward()
    assert len(seen) == 2 and all(o == expected for o in seen)  # forward and backward


def test_torch_compile_rejects_an_unknown_option():
    compiled = torch.compile(_mlp(), backend="fireclay", options={"colour": "blue"})
    with pytest.raises(Exception, match="unknown compile option 'colour'"):
        compiled(torch.randn(2, 5))


@pytest.mark.parametrize("kwargs, error, message", [
    ({"dynamic": "yes"}, TypeError, "dynamic must be None \\(automatic\\), True or False, got 'yes'"),
    ({"fullgraph": 1}, TypeError, "fullgraph must be True or False"),
    ({"mode": "fast"}, ValueError, "unknown mode 'fast'; modes are: default, reduce-overhead"),
    ({"mode": 3}, TypeError, "mode must be a string"),
    ({"options": {"colour": 1}}, ValueError, "unknown compile option 'colour'; options are: cudagraphs, max_autotune"),
    ({"options": {"max_autotune": "yes"}}, TypeError, "compile option 'max_autotune' must be bool, got 'yes'"),
    ({"options": ["max_autotune"]}, TypeError, "options must be a dict"),
    ({"mode": "max-autotune", "options": {"max_autotune": True}}, ValueError, "either mode= or options="),
    ({"backend": 3}, TypeError, "backend must be a backend name or a callable"),
    ({"backend": "no-such"}, fireclay.BackendNotFound, "unknown backend 'no-such'"),
])
def test_bad_arguments_raise_at_the_call(kwargs, error, message):
    with pytest.raises(error, match=message):
        fireclay.compile(_mlp(), **kwargs)
    with pytest.raises(error, match=message):
        fireclay.compile(**kwargs)  # the decorator form checks before it has a function


def test_set_stance_through_fireclay_compile():
    model = _mlp()
    compiled = fireclay.compile(model)
    x = torch.randn(2, 5)
    torch.testing.assert_close(compiled(x), model(x))
    y = torch.randn(3, 5)
    with fireclay.set_stance("fail_on_recompile"):
        with pytest.raises(fireclay.RecompileError, match=r"shape expected \(2, 5\), got \(3, 5\)"):
            compiled(y)
        torch.testing.assert_close(compiled(x), model(x))
    with fireclay.set_stance("eager_on_recompile"):
        torch.testing.assert_close(compiled(y), model(y))
    assert compiled._compiled.stats.captures == 1
    torch.testing.assert_close(compiled(y), model(y))  # default again: recompiles
    assert compiled._compiled.stats.captures == 2


def _records(caplog, name):
    return [r.getMessage() for r in caplog.records if r.name == name]


def test_stage_times_and_output_code_channels(caplog, monkeypatch, tmp_path):
    monkeypatch.setattr(fireclay.config, "compile_cache", False)
    monkeypatch.setattr(stages, "_output_code_root", str(tmp_path))
    model = _mlp()
    with caplog.at_level(logging.INFO, logger="fireclay.stage_times"), \
            caplog.at_level(logging.INFO, logger="fireclay.output_code"):
        compiled = fireclay.compile(model)
        x = torch.randn(2, 5, requires_grad=True)
        out = compiled(x)
        out.sum().backward()
    times = _records(caplog, "fireclay.stage_times")
    for stage in ("capture", "autograd", "loops", "cpp"):
        assert any(f": {stage} took " in t for t in times), (stage, times)
    code = _records(caplog, "fireclay.output_code")
    assert len(code) == 2  # forward and backward
    folders = [m.split(" code written to ")[1].split(" (")[0] for m in code]
    for folder in folders:
        assert folder.startswith(str(tmp_path))
        assert {"wrapper.py", "kernels0.cpp", "schedule.txt"} <= set(os.listdir(folder))


def test_output_code_writes_nothing_when_off(monkeypatch, tmp_path):
    monkeypatch.setattr(stages, "_output_code_root", str(tmp_path))
    compiled = fireclay.compile(_mlp())
    compiled(torch.randn(2, 5))
    assert os.listdir(tmp_path) == []


def test_debug_dir_writes_every_stage_of_every_graph(tmp_path):
    def two_graphs(x):
        y = torch.relu(x) + 1
        fireclay.graph_break()
        return y.sum(0) * 2

    with fireclay.config.patch(debug_dir=str(tmp_path), compile_cache=False):
        compiled = fireclay.compile(two_graphs)
        x = torch.randn(4, 3)
        torch.testing.assert_close(compiled(x), two_graphs(x))
    graphs = sorted(os.listdir(tmp_path))
    assert len(graphs) == 2 and all(g.startswith("graph-") for g in graphs)
    for graph in graphs:
        files = sorted(os.listdir(tmp_path / graph))
        assert [f for f in files if f.endswith(".fcir.json")] == [
            "00-captured.fcir.json", "01-aten.fcir.json", "02-loops.fcir.json"], files
        assert {"wrapper.py", "kernels0.cpp"} <= set(os.listdir(tmp_path / graph / "03-cpp"))
        import fireclay_ir

        for name in ("00-captured", "01-aten", "02-loops"):
            fireclay_ir.load(str(tmp_path / graph / f"{name}.fcir.json"))


def test_verbose_turns_on_recompiles_and_back_off(caplog):
    recompiles = logging.getLogger(logs.CHANNELS["recompiles"])
    before = recompiles.getEffectiveLevel()
    with fireclay.config.patch(verbose=True):
        assert recompiles.getEffectiveLevel() == logging.INFO
        assert logging.getLogger("fireclay_capture").getEffectiveLevel() == logging.INFO
        with caplog.at_level(logging.INFO, logger="fireclay"):
            compiled = fireclay.compile(_mlp())
            compiled(torch.randn(2, 5))
            compiled(torch.randn(3, 5))
    assert recompiles.getEffectiveLevel() == before
    assert any("recompiling" in r.getMessage() and "shape expected (2, 5), got (3, 5)" in r.getMessage()
               for r in caplog.records)


class _Terminal:
    def __init__(self, tty):
        self.tty = tty
        self.text = []

    def isatty(self):
        return self.tty

    def write(self, text):
        self.text.append(text)

    def flush(self):
        pass

    def fileno(self):
        raise OSError


@pytest.mark.parametrize("tty, ci, show, wanted", [
    (True, None, True, True), (False, None, True, False), (True, "true", True, False), (True, None, False, False),
])
def test_progress_only_on_a_terminal_outside_ci(tty, ci, show, wanted, monkeypatch):
    monkeypatch.setattr(sys, "stderr", _Terminal(tty))
    if ci is None:
        monkeypatch.delenv("CI", raising=False)
    else:
        monkeypatch.setenv("CI", ci)
    monkeypatch.setattr(fireclay.config, "show_progress", show)
    assert stages._progress_wanted() is wanted


def test_progress_names_the_graph_and_stage_of_a_long_compile(monkeypatch):
    terminal = _Terminal(True)
    monkeypatch.setattr(sys, "stderr", terminal)
    monkeypatch.delenv("CI", raising=False)
    monkeypatch.setattr(stages, "PROGRESS_AFTER_S", 0.2)
    with stages.stage("autograd", "graph 7 (forward at model.py:3)"):
        assert stages._progress.line() is None  # quiet for short compiles
        with stages.stage("loops", "graph 7 (forward at model.py:3)"):
            time.sleep(0.8)
    time.sleep(0.6)
    shown = "".join(terminal.text)
    assert "[fireclay] compiling graph 7 (forward at model.py:3): loops (" in shown
    assert shown.endswith("\r\x1b[K")  # cleared when the compile ends
    assert stages._progress.line() is None


def _fresh_python(code, **env):
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300,
                          env={**os.environ, **env})


def test_import_and_help_do_not_import_torch():
    result = _fresh_python(
        "import sys, fireclay, fireclay.cli\n"
        "assert 'torch' not in sys.modules, 'import fireclay imported torch'\n"
        "status = fireclay.cli.main(['--help'])\n"
        "assert 'torch' not in sys.modules, 'fireclay --help imported torch'\n"
        "sys.exit(status)")
    assert result.returncode == 0, result.stderr
    assert "capture" in result.stdout and "run" in result.stdout


def test_runs_on_cpu_without_triton():
    """A CPU-only install has neither fireclay-triton nor triton (the `cuda` extra)."""
    result = _fresh_python(
        "import sys\n"
        "sys.modules['triton'] = None; sys.modules['fireclay_triton'] = None\n"
        "import torch, fireclay\n"
        "m = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Tanh())\n"
        "x = torch.randn(3, 4, requires_grad=True)\n"
        "out = fireclay.compile(m)(x)\n"
        "torch.testing.assert_close(out, m(x)); out.sum().backward()\n"
        "from fireclay.backends.builtin import CudaSupportMissing, gpu_code_generator\n"
        "try:\n"
        "    gpu_code_generator()\n"
        "except CudaSupportMissing as e:\n"
        "    print(e)\n")
    assert result.returncode == 0, result.stderr
    assert "pip install 'fireclay[cuda]'" in result.stdout
