"""Every stage from files, as a user drives it: ``fireclay capture SCRIPT.py:FN``, then autograd,
loops and a code generator writing a folder that ``fireclay run FOLDER`` runs; outputs against
eager on the same inputs."""

import json
import os
import textwrap

import pytest
import torch

from fireclay.cli import main
from fireclay_ir.safetensors_io import raw_to_tensor, read_safetensors, tensor_to_raw, write_safetensors

SCRIPT = textwrap.dedent('''
    import torch

    torch.manual_seed(0)

    class Block(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.proj = torch.nn.Linear(6, 4)
            self.register_buffer("shift", torch.randn(4))

        def forward(self, x):
            return torch.relu(self.proj(x)) + self.shift

    block = Block()

    def pair(x, y):
        return (x @ y).sin() + 1, x.sum(1)

    def breaks(x):
        y = x + 1
        print("side effect")
        return y

    if __name__ == "__main__":
        raise SystemExit("the script's main block must not run")
''')


@pytest.fixture()
def script(tmp_path):
    path = tmp_path / "model.py"
    path.write_text(SCRIPT)
    namespace: dict = {"__name__": "model"}
    exec(compile(SCRIPT, str(path), "exec"), namespace)
    return path, namespace


def _inputs(tmp_path, values):
    path = str(tmp_path / "in.safetensors")
    write_safetensors(path, {f"in{i}": tensor_to_raw(v) for i, v in enumerate(values)})
    return path


def _outputs(path):
    tensors, _ = read_safetensors(path)
    return [raw_to_tensor(tensors[k]) for k in sorted(tensors)]


# (function name, example specs, inputs drawn for the run, train)
CASES = [
    ("block", ["randn:3x6"], [(3, 6)], False),
    ("Block", ["randn:3x6"], [(3, 6)], False),
    ("pair", ["randn:3x4", "randn:4x5"], [(3, 4), (4, 5)], False),
    ("block", ["randn:3x6"], [(3, 6)], True),
]


@pytest.mark.parametrize("generator", ["cpp", "triton"])
@pytest.mark.parametrize("name, specs, shapes, train", CASES, ids=[f"{c[0]}-{'train' if c[3] else 'infer'}" for c in CASES])
def test_capture_to_a_folder_that_runs(script, tmp_path, capsys, name, specs, shapes, train, generator):
    path, namespace = script
    os.chdir(tmp_path)
    torch_file = str(tmp_path / "p.fcir.json")
    assert main(["capture", f"{path}:{name}", "--example-inputs", *specs, "-o", torch_file]) == 0
    assert f"wrote {torch_file}" in capsys.readouterr().out
    aten = str(tmp_path / "p.aten.fcir.json")
    assert main(["autograd", torch_file, "-o", aten, *(["--train"] if train else [])]) == 0
    loops = str(tmp_path / "p.loops.fcir.json")
    assert main(["loops", aten, "-o", loops]) == 0
    folder = str(tmp_path / f"code_{generator}")
    assert main([generator, loops, "-o", folder]) == 0
    assert f"fireclay run {folder}" in capsys.readouterr().out
    manifest = json.loads(open(os.path.join(folder, "fireclay-code.json")).read())
    assert manifest["generator"] == generator and "wrapper.py" in manifest["files"]
    values = [torch.randn(s) for s in shapes]
    out = str(tmp_path / "out.safetensors")
    assert main(["run", folder, "--inputs", _inputs(tmp_path, values), "--save-outputs", out]) == 0
    assert "differs" not in capsys.readouterr().err  # the folder's code is what its program gives
    if name == "Block":  # the command made an instance right after the script ran: so do we
        fresh = {"__name__": "model"}
        exec(compile(SCRIPT, str(path), "exec"), fresh)
        target = fresh["Block"]()
    else:
        target = namespace[name]
    with torch.no_grad():
        expected = target(*values)
    expected = list(expected) if isinstance(expected, tuple) else [expected]
    got = _outputs(out)[:len(expected)]  # a training forward also returns what it saves
    for g, e in zip(got, expected):
        torch.testing.assert_close(g, e, rtol=1e-4, atol=1e-5)


def test_an_edited_folder_is_reported(script, tmp_path, capsys):
    path, _ = script
    program = str(tmp_path / "p.fcir.json")
    aten = str(tmp_path / "p.aten.fcir.json")
    assert main(["capture", f"{path}:block", "--example-inputs", "randn:2x6", "-o", program]) == 0
    assert main(["autograd", program, "-o", aten]) == 0
    folder = str(tmp_path / "code")
    assert main(["cpp", aten, "-o", folder]) == 0
    with open(os.path.join(folder, "wrapper.py"), "a") as f:
        f.write("# edited\n")
    capsys.readouterr()
    assert main(["run", folder]) == 0
    assert "wrapper.py differs from what fireclay-cpp generates" in capsys.readouterr().err


@pytest.mark.parametrize("argv, message", [
    (["capture", "{path}:breaks", "--example-inputs", "randn:3"], "does not capture in one graph"),
    (["capture", "{path}:nothing"], "defines no 'nothing' at its top level"),
    (["capture", "{path}"], "expected SCRIPT.py:FUNCTION"),
    (["capture", "missing.py:fn"], "no such file: missing.py"),
    (["run", "{folder}"], "without fireclay-code.json"),
])
def test_capture_and_run_folder_errors_are_one_line(script, tmp_path, capsys, argv, message):
    path, _ = script
    argv = [a.format(path=path, folder=tmp_path) for a in argv]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("fireclay: error: ") and message in err


def test_capture_dynamic_program_keeps_its_symbols(script, tmp_path, capsys):
    import fireclay_ir

    path, _ = script
    out = str(tmp_path / "d.fcir.json")
    assert main(["capture", f"{path}:pair", "--example-inputs", "randn:3x4", "randn:4x5", "--dynamic", "-o", out]) == 0
    program = fireclay_ir.load(out)
    assert program.symbols and all("L[" not in g for g in program.guards)
