"""``fireclay autograd`` and ``fireclay run`` of a loops document, on documents from someone else:
both are bounded in steps and bytes as ``fireclay run`` of a torch or aten document is
(``--max-steps``, ``--max-bytes``, fireclay-ir's ``RunLimits``), and a loops document cannot call
an op that reads files. Each ends with one error line and exit status 2."""

from __future__ import annotations

import os

import pytest

import fireclay_ir as ir
from fireclay.cli import main

torch = pytest.importorskip("torch")
fireclay_loops = pytest.importorskip("fireclay_loops")


def f32(*shape) -> ir.TensorMeta:
    return ir.TensorMeta("float32", tuple(shape))


def write(program: ir.Program, path) -> str:
    # (written as is, not through save: a hostile file is whatever its author wrote)
    with open(path, "w") as f:
        f.write(ir.dumps(program))
    return str(path)


@pytest.fixture
def fireclay(capsys):
    def run(*argv: str) -> tuple[int, str]:
        status = main(list(argv))
        return status, capsys.readouterr().err

    return run


def _chain(length: int, shape=(3,)) -> ir.Program:
    g = ir.Graph("main")
    y = g.add_input("x", ir.TensorMeta("float64", shape))
    for _ in range(length):
        y = g.call("torch::operator.add", [y, 1.0], out=ir.TensorMeta("float64", shape))
    g.set_outputs([y])
    return ir.Program.single(g)


def test_autograd_refuses_a_huge_declared_input(tmp_path, fireclay):
    path = write(_chain(1, (2**20, 2**20)), tmp_path / "big.fcir.json")  # 8 TiB of generated input
    status, err = fireclay("autograd", path, "-o", str(tmp_path / "out.fcir.json"))
    assert status == 2, err
    assert "input %x needs 8796093022208 bytes" in err


@pytest.mark.parametrize("train", [False, True], ids=["inference", "training"])
def test_autograd_stops_at_the_step_limit(tmp_path, fireclay, train):
    path = write(_chain(50), tmp_path / "long.fcir.json")
    status, err = fireclay("autograd", path, "-o", str(tmp_path / "out.fcir.json"), "--max-steps", "20",
                           *(["--train"] if train else []))
    assert status == 2, err
    assert "more than 20 steps" in err
    assert not os.path.exists(tmp_path / "out.fcir.json")


def _loops_document() -> ir.Program:
    g = ir.Graph("main")
    x = g.add_input("x", f32(4, 4))
    g.set_outputs([g.call("aten::mm.default", [g.call("aten::relu.default", [x], out=f32(4, 4)), x], out=f32(4, 4))])
    return fireclay_loops.to_program(fireclay_loops.schedule(fireclay_loops.lower(ir.Program.single(g))))


def test_a_loops_document_runs_within_limits(tmp_path, fireclay):
    path = write(_loops_document(), tmp_path / "ok.fcir.json")
    status, err = fireclay("run", path)
    assert status == 0, err
    status, err = fireclay("run", path, "--max-steps", "1")
    assert status == 2 and "more than 1 steps" in err, err


def test_a_loops_document_cannot_read_a_file(tmp_path, fireclay):
    program = _loops_document()
    extern = next(n for n in program.main.nodes if n.op == "loops::extern")
    extern.kwargs["op"] = "aten::from_file.default"
    extern.kwargs["args"] = ["/etc/passwd", False, 16]
    status, err = fireclay("run", write(program, tmp_path / "read.fcir.json"))
    assert status == 2, err
    assert "aten::from_file.default is refused in a program: it reads or writes files" in err


def test_a_loops_document_cannot_allocate_without_bound(tmp_path, fireclay):
    program = _loops_document()
    program.add_symbol("s0", hint=2**40)
    buffer = next(n for n in program.main.nodes if n.op == "loops::buffer" and n.kwargs.get("allocation"))
    buffer.outputs[0].type = f32("s0", 4)  # 16 TiB
    status, err = fireclay("run", write(program, tmp_path / "alloc.fcir.json"), "--max-bytes", str(2**30))
    assert status == 2, err
    assert "needs 17592186044416 bytes" in err
