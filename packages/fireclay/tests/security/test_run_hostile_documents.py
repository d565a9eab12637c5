"""``fireclay run`` on documents from someone else: a document that would run Python, read a
file, loop forever or allocate without bound ends with one error line (exit status 2), and
nothing outside the program happens."""

from __future__ import annotations

import os
from dataclasses import dataclass

import pytest

import fireclay_ir as ir
from fireclay.cli import main

torch = pytest.importorskip("torch")

OPAQUE = ir.ScalarType("opaque")


def f32(*shape) -> ir.TensorMeta:
    return ir.TensorMeta("float32", tuple(shape))


@dataclass
class Result:
    returncode: int
    stdout: str
    stderr: str


@pytest.fixture
def fireclay_run(capsys):
    def run(path: str, *extra: str) -> Result:
        status = main(["run", path, *extra])
        out = capsys.readouterr()
        return Result(status, out.out, out.err)

    return run


def write(program: ir.Program, path) -> str:
    # dumps/save do not check ops: a hostile file is written exactly as an attacker would.
    path = str(path)
    with open(path, "w") as f:
        f.write(ir.dumps(program))
    return path


def exploit(marker: str) -> ir.Program:
    g = ir.Graph("main")
    x = g.add_input("x", f32(2))
    get = "torch::Tensor.__getattribute__"
    func = g.call(get, [g.call(get, [x, "__repr__"], out=OPAQUE), "__func__"], out=OPAQUE)
    builtins = g.call("torch::operator.getitem", [g.call(get, [func, "__globals__"], out=OPAQUE), "__builtins__"],
                      out=OPAQUE)
    exec_ = g.call("torch::operator.getitem", [builtins, "exec"], out=OPAQUE)
    g.call("torch::torch.cond", [True, exec_, exec_, [f"open({marker!r}, 'w').close()"]], out=[])
    g.set_outputs([x])
    return ir.Program.single(g)


def test_a_document_cannot_run_python(tmp_path, fireclay_run):
    marker = str(tmp_path / "pwned")
    result = fireclay_run(write(exploit(marker), tmp_path / "exploit.fcir.json"))
    assert result.returncode == 2, result.stderr
    assert "unknown op 'torch::Tensor.__getattribute__'" in result.stderr
    assert not os.path.exists(marker)


def test_a_document_cannot_read_a_file(tmp_path, fireclay_run):
    g = ir.Graph("main")
    g.set_outputs([g.call("aten::from_file.default", ["/etc/passwd", False, 16], {"dtype": ir.DType("uint8")},
                          out=ir.TensorMeta("uint8", (16,)))])
    result = fireclay_run(write(ir.Program.single(g), tmp_path / "read.fcir.json"), "--print-values")
    assert result.returncode == 2, result.stderr
    assert "it reads or writes files" in result.stderr
    assert "root" not in result.stdout


def test_an_endless_loop_stops(tmp_path, fireclay_run):
    p = ir.Program()
    cond = p.add_graph(ir.Graph("loop_cond"))
    cond.add_input("x", f32(2))
    cond.set_outputs([True])
    body = p.add_graph(ir.Graph("loop_body"))
    body.set_outputs([body.add_input("x", f32(2))])
    main = p.add_graph(ir.Graph("main"))
    x = main.add_input("x", f32(2))
    main.set_outputs(main.call("hop::while_loop", [ir.GraphRef("loop_cond"), ir.GraphRef("loop_body"), [x], []],
                               out=[f32(2)]))
    result = fireclay_run(write(p, tmp_path / "loop.fcir.json"), "--max-steps", "2000")
    assert result.returncode == 2, result.stderr
    assert "more than 2000 steps" in result.stderr


def test_a_huge_declared_input_is_refused_before_it_is_made(tmp_path, fireclay_run):
    g = ir.Graph("main")
    x = g.add_input("x", ir.TensorMeta("float64", (2**20, 2**20)))  # 8 TiB of generated input
    g.set_outputs([x])
    result = fireclay_run(write(ir.Program.single(g), tmp_path / "big.fcir.json"))
    assert result.returncode == 2, result.stderr
    assert "input %x needs 8796093022208 bytes" in result.stderr


def test_an_allocation_the_document_hides_is_refused(tmp_path, fireclay_run):
    g = ir.Graph("main")
    g.add_input("x", f32(2))
    g.set_outputs([g.call("torch::torch.ones", [[2**40]], out=f32(2))])
    result = fireclay_run(write(ir.Program.single(g), tmp_path / "alloc.fcir.json"))
    assert result.returncode == 2, result.stderr
    assert "would allocate 4398046511104 bytes" in result.stderr


def test_an_honest_document_still_runs(tmp_path, fireclay_run):
    g = ir.Graph("main")
    x = g.add_input("x", f32(3))
    g.set_outputs([g.call("torch::torch.nn.functional.relu", [g.call("torch::operator.sub", [x, 0.5], out=f32(3))],
                          out=f32(3))])
    path = str(tmp_path / "ok.fcir.json")
    ir.save(ir.Program.single(g), path)
    result = fireclay_run(path, "--inputs", "ones:3:float32", "--print-values")
    assert result.returncode == 0, result.stderr
    assert "0.5" in result.stdout
