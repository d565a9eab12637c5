"""A new user's walk through fireclay, as README.md and docs/debugging.md tell it: install from a
clone (README's own commands, each in a fresh environment), compile with fireclay.compile and
torch.compile(backend="fireclay", mode=...), read the logs, change the stance, and take a model
through every stage from files to a folder of code that runs."""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
import sys
import textwrap

import pytest
import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

MODEL = textwrap.dedent('''
    import torch

    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.GELU(), torch.nn.Linear(16, 4))

    def step(x):
        y = net(x)
        print("logged between graphs")     # a graph break
        return y.softmax(-1)
''')


def _python(code: str, *, python: str = sys.executable, cwd: str | None = None, isolated: bool = False):
    """Run ``code``; ``isolated``: in a fresh environment, which must not see this one's PYTHONPATH."""
    env = {k: v for k, v in os.environ.items() if not (isolated and k == "PYTHONPATH")}
    return subprocess.run([python, "-c", code], capture_output=True, text=True, timeout=300, cwd=cwd, env=env)


# -- install, as README.md says


def _readme_installs() -> dict[str, list[str]]:
    """README's Install section: each `pip install ./packages/...` command, by what it installs."""
    text = open(os.path.join(ROOT, "README.md")).read()
    section = text.split("## Install", 1)[1].split("\n## ", 1)[0]
    commands = [line.split("#")[0].strip() for line in section.splitlines() if line.startswith("pip install ./packages")
                or line.startswith('pip install "./packages')]
    by_name = {}
    for command in commands:
        args = shlex.split(command)[2:]
        if args == ["./packages/fireclay-ir"]:
            by_name["fireclay-ir alone"] = args
        elif args[-1] == "./packages/fireclay-capture" and "./packages/fireclay" not in args:
            by_name["fireclay-capture alone"] = args
        elif args[0] == "./packages/fireclay":
            by_name["everything, CPU only"] = args
    return by_name


def _uv() -> str | None:
    """uv: the nox integration session names its own (FIRECLAY_UV), else the one on PATH."""
    found = (os.environ.get("FIRECLAY_UV") or shutil.which("uv")
             or os.path.join(os.path.dirname(sys.executable), "uv"))
    return found if found and os.path.exists(found) else None


# What each fresh environment must then do.
CHECKS = {
    "fireclay-ir alone": (
        "import importlib.util, subprocess, sys, fireclay_ir\n"
        "assert importlib.util.find_spec('torch') is None, 'fireclay-ir pulled torch'\n"
        "from fireclay_ir import Graph, Program, TensorMeta\n"
        "g = Graph('main'); x = g.add_input('x', TensorMeta('float32', (2, 3))); g.set_outputs([x])\n"
        "fireclay_ir.save(Program.single(g), 'p.fcir.json')\n"
        "done = subprocess.run([sys.executable, '-m', 'fireclay_ir', 'verify', 'p.fcir.json'], capture_output=True, text=True)\n"
        "assert done.returncode == 0 and 'verified' in done.stdout, done.stderr\n"),
    "fireclay-capture alone": (
        "import importlib.util, torch, fireclay_capture\n"
        "assert importlib.util.find_spec('fireclay') is None and importlib.util.find_spec('fireclay_autograd') is None\n"
        "f = fireclay_capture.capture(lambda x: (x.sin() * 2).sum(0))\n"
        "x = torch.randn(3, 4); torch.testing.assert_close(f(x), (x.sin() * 2).sum(0))\n"
        "assert f.last_program is not None\n"),
    "everything, CPU only": (
        "import importlib.util, subprocess, sys, os, torch, fireclay\n"
        "assert importlib.util.find_spec('triton') is None, 'a CPU-only install pulled triton'\n"
        "m = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU())\n"
        "x = torch.randn(2, 4)\n"
        "torch.testing.assert_close(fireclay.compile(m)(x), m(x))\n"
        "torch.testing.assert_close(torch.compile(m, backend='fireclay', mode='max-autotune')(x), m(x))\n"
        "script = os.path.join(os.path.dirname(sys.executable), 'fireclay')\n"
        "done = subprocess.run([script, '--help'], capture_output=True, text=True)\n"
        "assert done.returncode == 0 and 'capture' in done.stdout, done.stderr\n"),
}


@pytest.mark.parametrize("scenario", list(CHECKS))
def test_readme_install_in_a_fresh_environment(scenario, tmp_path):
    uv = _uv()
    if uv is None or os.environ.get("FIRECLAY_SKIP_INSTALL_TESTS"):
        pytest.skip("needs uv (nox installs it) to build fresh environments quickly")
    args = _readme_installs()[scenario]
    venv = tmp_path / "venv"
    subprocess.run([uv, "venv", "-q", str(venv), "--python", sys.executable], check=True, timeout=120)
    python = str(venv / "bin" / "python")
    links = os.environ.get("UV_FIND_LINKS") or os.environ.get("PIP_FIND_LINKS") or ""
    # README's pip command, through uv (same arguments), with the repository's pins for torch.
    install = [uv, "pip", "install", "-q", "--python", python, "-c", os.path.join(ROOT, "constraints.txt"),
               *(a for link in links.split() for a in ("--find-links", link)), *args]
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    done = subprocess.run(install, cwd=ROOT, capture_output=True, text=True, timeout=600, env=env)
    assert done.returncode == 0, done.stderr[-3000:]
    checked = _python(CHECKS[scenario], python=python, cwd=str(tmp_path), isolated=True)
    assert checked.returncode == 0, checked.stderr[-3000:]


# -- compile, logs, stances


def test_compile_logs_and_stances(tmp_path):
    script = tmp_path / "walk.py"
    script.write_text(MODEL + textwrap.dedent('''
        import fireclay
        compiled = fireclay.compile(step)
        for batch in (2, 3):
            x = torch.randn(batch, 8)
            torch.testing.assert_close(compiled(x), step(x))
        with fireclay.set_stance("fail_on_recompile"):
            try:
                compiled(torch.randn(5, 8))
            except fireclay.RecompileError as e:
                print("STANCE", e)
        try:
            fireclay.compile(step, dynamic="yes")
        except TypeError as e:
            print("ARGS", e)
        via_torch = torch.compile(net, backend="fireclay", mode="max-autotune")
        x = torch.randn(2, 8)
        torch.testing.assert_close(via_torch(x), net(x))
    '''))
    channels = "recompiles,graph_breaks,guards,output_code,perf_hints,stage_times"
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=600,
                          env={**os.environ, "FIRECLAY_LOG": channels, "FIRECLAY_COMPILE_CACHE": "0",
                               "FIRECLAY_DEBUG_DIR": str(tmp_path / "debug")})
    assert done.returncode == 0, done.stderr[-3000:]
    err = done.stderr
    assert re.search(r"\[fireclay\.capture\.recompiles\] INFO: recompiling step \(.*walk\.py:\d+\): entry 0: "
                     r"L\['x'\]: shape expected \(2, 8\), got \(3, 8\)", err), err
    assert re.search(r"\[fireclay\.capture\.graph_breaks\] INFO: graph break in step at .*walk\.py:\d+", err), err
    assert "[fireclay.capture.guards] INFO: guards of step" in err
    assert re.search(r"\[fireclay\.output_code\] INFO: graph \d+ \(step at .*walk\.py:\d+\): cpp code written to "
                     + re.escape(str(tmp_path / "debug")), err), err
    assert "[fireclay.perf_hints] INFO: fireclay: option max_autotune has no effect on CPU tensors" in err
    for stage in ("capture", "autograd", "loops", "cpp"):
        assert f": {stage} took " in err
    assert re.search(r"STANCE .* would be captured again under set_stance\('fail_on_recompile'\): .*"
                     r"shape expected \(\d, \d+\), got \(5, \d+\)", done.stdout), done.stdout
    assert "ARGS fireclay.compile: dynamic must be None" in done.stdout
    graphs = os.listdir(tmp_path / "debug")
    assert any("step" in g for g in graphs)


# -- every stage from files


def _fireclay(*argv: str, cwd: str):
    from fireclay.cli import main

    here = os.getcwd()
    os.chdir(cwd)
    try:
        return main(list(argv))
    finally:
        os.chdir(here)


@pytest.mark.parametrize("train", [False, True], ids=["inference", "training"])
def test_every_stage_from_files(tmp_path, capsys, train):
    (tmp_path / "model.py").write_text(MODEL)
    cwd = str(tmp_path)
    assert _fireclay("capture", "model.py:net", "--example-inputs", "randn:4x8", "-o", "net.fcir.json", cwd=cwd) == 0
    assert _fireclay("autograd", "net.fcir.json", "-o", "net.aten.fcir.json", *(["--train"] if train else []),
                     cwd=cwd) == 0
    assert _fireclay("loops", "net.aten.fcir.json", "-o", "net.loops.fcir.json", cwd=cwd) == 0
    assert _fireclay("cpp", "net.loops.fcir.json", "-o", "net_cpp", cwd=cwd) == 0
    verify = _python("import sys; sys.modules['torch'] = None\nfrom fireclay_ir.__main__ import main\n"
                     "sys.exit(main(['verify', 'net.loops.fcir.json']))", cwd=cwd)
    assert verify.returncode == 0, verify.stderr
    from fireclay_ir.safetensors_io import raw_to_tensor, read_safetensors, tensor_to_raw, write_safetensors

    x = torch.randn(4, 8)
    write_safetensors(str(tmp_path / "x.safetensors"), {"x": tensor_to_raw(x)})
    capsys.readouterr()
    assert _fireclay("run", "net_cpp", "--inputs", "x.safetensors", "--save-outputs", "out.safetensors", cwd=cwd) == 0
    tensors, _ = read_safetensors(str(tmp_path / "out.safetensors"))
    namespace: dict = {"__name__": "model"}
    exec(compile(MODEL, "model.py", "exec"), namespace)
    with torch.no_grad():
        torch.testing.assert_close(raw_to_tensor(tensors["out0"]), namespace["net"](x), rtol=1e-4, atol=1e-5)
