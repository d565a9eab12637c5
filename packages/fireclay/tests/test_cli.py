"""The ``fireclay`` command, in process (``main(argv)``) over a table of captured programs, and
end to end through a subprocess; values are checked against eager on fresh random inputs."""

import os
import shutil
import subprocess
import sys

import pytest
import torch

import fireclay_ir as ir
from fireclay.cli import main
from fireclay.cli.inputs import InputSpecError, parse_input, save_tensors
from fireclay_capture import capture
from fireclay_ir.safetensors_io import raw_to_tensor, read_safetensors


def mlp(x, w1, w2):
    return torch.nn.functional.gelu(x @ w1) @ w2


def norm(x, w):
    return torch.nn.functional.layer_norm(x, x.shape[-1:], w) * 2 - x.mean()


def softmax_rows(x):
    return torch.softmax(x, dim=-1).sum(dim=0)


def two_outputs(x, y):
    return x * y + 1.0, (x - y).relu()


class Block(torch.nn.Module):
    """Weights travel in the program's .fcir.safetensors file."""

    def __init__(self):
        super().__init__()
        self.proj = torch.nn.Linear(6, 4)
        self.register_buffer("shift", torch.randn(4))

    def forward(self, x):
        return torch.relu(self.proj(x)) + self.shift


torch.manual_seed(0)
BLOCK = Block()
BLOCK.__name__ = "block"

# (function or module, input shapes): every input is float32, drawn fresh for each test.
PROGRAMS = [
    (BLOCK, [(3, 6)]),
    (mlp, [(5, 8), (8, 16), (16, 3)]),
    (norm, [(4, 6), (6,)]),
    (softmax_rows, [(3, 7)]),
    (two_outputs, [(2, 3), (2, 3)]),
]
IDS = [fn.__name__ for fn, _ in PROGRAMS]


def captured_program(fn, shapes):
    programs = []

    def keep(program, example_inputs):
        programs.append(program)
        return lambda *args: ir.interpret(program, *args)

    capture(fn, backend=keep)(*[torch.randn(s) for s in shapes])
    return programs[0]


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    """Each table entry captured and saved once: name -> (function, shapes, path)."""
    folder = tmp_path_factory.mktemp("programs")
    out = {}
    for fn, shapes in PROGRAMS:
        path = str(folder / f"{fn.__name__}.fcir.json")
        ir.save(captured_program(fn, shapes), path)
        out[fn.__name__] = (fn, shapes, path)
    return out


def fresh_inputs(shapes, path):
    values = [torch.randn(s) for s in shapes]
    save_tensors(path, values, "in")  # names in0, in1, ... sort in input order below ten inputs
    return values


def read_outputs(path):
    tensors, _ = read_safetensors(path)
    return [raw_to_tensor(tensors[f"out{i}"]) for i in range(len(tensors))]


def eager_outputs(fn, values):
    out = fn(*values)
    return list(out) if isinstance(out, tuple) else [out]


def run_file(path, inputs_path, tmp_path, capsys):
    out_path = str(tmp_path / "outputs.safetensors")
    assert main(["run", path, "--inputs", inputs_path, "--save-outputs", out_path]) == 0
    printed = capsys.readouterr().out
    assert "output 0: float32[" in printed
    return read_outputs(out_path)


def assert_all_close(actual, expected):
    assert len(actual) == len(expected)
    for a, e in zip(actual, expected):
        torch.testing.assert_close(a, e, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("name", IDS)
def test_show_prints_ops_and_source_lines(saved, name, capsys):
    fn, _, path = saved[name]
    assert main(["show", path, "--verify"]) == 0
    text = capsys.readouterr().out
    assert text.startswith("# fireclay-ir format")
    assert text.strip().endswith("# verified")
    assert "graph main(" in text
    assert "test_cli.py:" in text  # the source line comments point into this file
    assert text == ir.format_program(ir.load(path)) + "# verified\n"


@pytest.mark.parametrize("name", IDS)
def test_run_matches_eager(saved, name, tmp_path, capsys):
    fn, shapes, path = saved[name]
    values = fresh_inputs(shapes, str(tmp_path / "inputs.safetensors"))
    assert_all_close(run_file(path, str(tmp_path / "inputs.safetensors"), tmp_path, capsys), eager_outputs(fn, values))


@pytest.mark.parametrize("name", IDS)
def test_autograd_then_loops_then_codegen_match_eager(saved, name, tmp_path, capsys):
    fn, shapes, path = saved[name]
    aten, loops = str(tmp_path / "aten.fcir.json"), str(tmp_path / "loops.fcir.json")
    assert main(["autograd", path, "-o", aten]) == 0
    assert main(["loops", aten, "-o", loops]) == 0
    assert "kernels:" in capsys.readouterr().out  # the schedule report
    assert {n.dialect for n in ir.load(aten).main.nodes} == {"aten"}
    assert {n.dialect for n in ir.load(loops).main.nodes} == {"loops"}
    inputs = str(tmp_path / "inputs.safetensors")
    values = fresh_inputs(shapes, inputs)
    expected = eager_outputs(fn, values)
    assert_all_close(run_file(aten, inputs, tmp_path, capsys), expected)
    assert_all_close(run_file(loops, inputs, tmp_path, capsys), expected)
    for backend, expected_files in (("cpp", {"wrapper.py", "schedule.txt"}), ("triton", {"wrapper.py", "kernels.py"})):
        if backend == "cpp" and shutil.which("g++") is None and shutil.which("c++") is None:
            continue
        folder = tmp_path / backend
        assert main([backend, loops, "-o", str(folder)]) == 0
        assert expected_files <= set(os.listdir(folder))
        assert f"wrote {folder}" in capsys.readouterr().out


@pytest.mark.parametrize("name", ["mlp", "two_outputs"])
def test_autograd_train_writes_a_forward_backward_pair(saved, name, tmp_path, capsys):
    fn, shapes, path = saved[name]
    forward_path = str(tmp_path / "g.fcir.json")
    assert main(["autograd", path, "-o", forward_path, "--train"]) == 0
    backward_path = str(tmp_path / "g.backward.fcir.json")
    assert f"wrote {backward_path}" in capsys.readouterr().out
    forward, backward = ir.load(forward_path), ir.load(backward_path)
    values = [torch.randn(s, requires_grad=True) for s in shapes]
    expected = eager_outputs(fn, values)
    fw_out = ir.interpret(forward, *[v.detach() for v in values])
    assert_all_close(list(fw_out[:len(expected)]), [e.detach() for e in expected])
    tangents = [torch.randn_like(e) for e in expected]
    grads = ir.interpret(backward, *fw_out[len(expected):], *tangents)
    eager_grads = torch.autograd.grad(expected, values, tangents)
    assert_all_close(list(grads), list(eager_grads))


# -- errors: one line, exit status 2, no traceback


def user_error(argv, capsys):
    status = main(argv)
    err = capsys.readouterr().err
    assert status == 2, err
    assert err.startswith("fireclay: error: ")
    assert err.count("\n") == 1 and "Traceback" not in err
    return err


@pytest.fixture()
def malformed(tmp_path):
    path = tmp_path / "broken.fcir.json"
    path.write_text('{"format": "fireclay-ir", "version": [1, 0], "graphs": 7')
    return str(path)


ERROR_CASES = [
    (lambda p, m: ["show", "/nonexistent/x.fcir.json"], "no such file: /nonexistent/x.fcir.json"),
    (lambda p, m: ["show", m], "broken.fcir.json is not a readable fireclay-ir file"),
    (lambda p, m: ["transmogrify", p], "invalid choice: 'transmogrify'"),
    (lambda p, m: ["loops", p, "-o", "x.fcir.json"], "takes a program in the aten dialect"),
    (lambda p, m: ["cpp", p, "-o", "out"], "Run `fireclay autograd`"),
    (lambda p, m: ["run", p, "--inputs", "randn:3x4"], "the program takes 3 input(s)"),
    (lambda p, m: ["run", p, "--inputs", "gauss:3x4", "randn:1", "randn:1"], "expected KIND:SHAPE[:DTYPE]"),
    (lambda p, m: ["run", p, "--inputs", "weights.pt"], "pickle files are not read"),
    (lambda p, m: ["run", p, "--inputs", "randn:3xq", "randn:1", "randn:1"], "is not sizes joined by 'x'"),
    (lambda p, m: ["autograd", p], "the following arguments are required: -o/--output"),
]


@pytest.mark.parametrize("make_argv, expected", ERROR_CASES, ids=[e for _, e in ERROR_CASES])
def test_user_errors_are_one_line(saved, malformed, make_argv, expected, capsys):
    err = user_error(make_argv(saved["mlp"][2], malformed), capsys)
    assert expected in err


def test_debug_shows_the_traceback(capsys):
    with pytest.raises(Exception, match="no such file"):
        main(["--debug", "show", "/nonexistent/x.fcir.json"])


def test_run_mismatched_shape_is_a_stage_error_not_a_crash(saved, capsys):
    status = main(["run", saved["mlp"][2], "--inputs", "randn:5x8", "randn:9x16", "randn:16x3"])
    err = capsys.readouterr().err
    assert status in (1, 2) and "Traceback" not in err and err.startswith("fireclay:")


INPUT_SPECS = [
    ("randn:2x3:float32", torch.float32, (2, 3)),
    ("rand:4:float64", torch.float64, (4,)),
    ("zeros:2x1:int64", torch.int64, (2, 1)),
    ("ones:3:bool", torch.bool, (3,)),
    ("randint:5", torch.int64, (5,)),
    ("randn::float16", torch.float16, ()),
]


@pytest.mark.parametrize("spec, dtype, shape", INPUT_SPECS)
def test_input_specs(spec, dtype, shape):
    (t,) = parse_input(spec, torch.Generator().manual_seed(1))
    assert t.dtype == dtype and tuple(t.shape) == shape
    if spec.startswith("zeros"):
        assert not t.any()
    if spec.startswith("ones"):
        assert t.all()


def test_scalar_and_safetensors_specs(tmp_path):
    g = torch.Generator().manual_seed(0)
    assert parse_input("int:7", g) == [7] and parse_input("float:2.5", g) == [2.5] and parse_input("bool:true", g) == [True]
    a, b = torch.randn(2, 2), torch.arange(3)
    path = str(tmp_path / "t.safetensors")
    save_tensors(path, [a, b], "t")
    both = parse_input(path, g)
    assert torch.equal(both[0], a) and torch.equal(both[1], b)
    assert torch.equal(parse_input(path + ":t1", g)[0], b)
    with pytest.raises(InputSpecError, match="holds no tensor 'zz'"):
        parse_input(path + ":zz", g)


# -- end to end through a new process


def test_the_command_runs_in_a_new_process(saved, tmp_path):
    # One process only: starting one imports torch, which is slow on small CI machines.
    fn, shapes, path = saved["two_outputs"]
    inputs = str(tmp_path / "in.safetensors")
    values = fresh_inputs(shapes, inputs)
    outputs = str(tmp_path / "out.safetensors")
    # The console script of this environment when installed, else `python -m fireclay`.
    script = os.path.join(os.path.dirname(sys.executable), "fireclay")
    command = [script] if os.path.exists(script) else [sys.executable, "-m", "fireclay"]
    done = subprocess.run([*command, "run", path, "--inputs", inputs, "--save-outputs", outputs],
                          capture_output=True, text=True, timeout=240)
    assert done.returncode == 0, done.stderr
    assert "output 1: float32[2, 3]" in done.stdout
    assert_all_close(read_outputs(outputs), eager_outputs(fn, values))


def test_help_lists_every_subcommand(capsys):
    assert main(["--help"]) == 0
    text = capsys.readouterr().out
    for command in ("show", "run", "autograd", "loops", "cpp", "triton", "report"):
        assert command in text
