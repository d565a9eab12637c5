"""``python -m fireclay_ir show|verify FILE``, in a process where torch cannot be imported."""

import os
import subprocess
import sys

import pytest
from format_samples import cond_program, mlp_aten, torch_dialect

import fireclay_ir as ir

# sys.modules["torch"] = None makes every `import torch` fail, as on a machine without it.
WITHOUT_TORCH = ("import sys; sys.modules['torch'] = None; from fireclay_ir.__main__ import main; "
                 "sys.exit(main(sys.argv[1:]))")


def _run(*argv):
    return subprocess.run([sys.executable, "-c", WITHOUT_TORCH, *argv], capture_output=True, text=True,
                          timeout=120, env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)})


@pytest.mark.parametrize("build", [mlp_aten, torch_dialect, cond_program])
def test_show_and_verify_without_torch(build, tmp_path):
    program = build()
    path = str(tmp_path / "p.fcir.json")
    ir.save(program, path)
    shown = _run("show", path)
    assert shown.returncode == 0, shown.stderr
    assert shown.stdout == ir.format_program(ir.load(path, weights="none"))
    verified = _run("verify", path)
    assert verified.returncode == 0, verified.stderr
    assert f"{path}: verified" in verified.stdout


@pytest.mark.parametrize("content, status, message", [
    (None, 2, "No such file"),
    ("{not json", 2, "fireclay_ir: error: "),
])
def test_errors_are_one_line(tmp_path, content, status, message):
    path = tmp_path / "bad.fcir.json"
    if content is not None:
        path.write_text(content)
    result = _run("verify", str(path))
    assert result.returncode == status
    assert message in result.stderr and len(result.stderr.strip().splitlines()) == 1
