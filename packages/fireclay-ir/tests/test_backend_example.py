"""docs/writing-a-backend.md: its example runs with fireclay-ir alone, and the page shows it."""

from __future__ import annotations

import pathlib
import random
import re
import subprocess
import sys

import pytest
from backend_example import compile_to_lists, count_flops

from fireclay_ir import Graph, Program, TensorMeta

HERE = pathlib.Path(__file__).parent
DOC = HERE.parents[2] / "docs" / "writing-a-backend.md"


def mlp(hidden: int = 5) -> Program:
    g = Graph("main")
    x = g.add_input("x", TensorMeta("float32", ("s0", 3)))
    w1 = g.add_input("w1", TensorMeta("float32", (3, hidden)))
    w2 = g.add_input("w2", TensorMeta("float32", (2, hidden)))
    h = g.call("aten::mm.default", [x, w1], out=TensorMeta("float32", ("s0", hidden)))
    a = g.call("aten::relu.default", [h], out=TensorMeta("float32", ("s0", hidden)))
    a2 = g.call("aten::relu.default", [h], out=TensorMeta("float32", ("s0", hidden)))  # CSE'd
    g.call("aten::sigmoid.default", [h], out=TensorMeta("float32", ("s0", hidden)))    # dead
    wt = g.call("aten::t.default", [w2], out=TensorMeta("float32", (hidden, 2)))
    y = g.call("aten::mm.default", [a, wt], out=TensorMeta("float32", ("s0", 2)))
    z = g.call("aten::add.Tensor", [y, a2], {"alpha": 0}, out=TensorMeta("float32", ("s0", 2))) \
        if hidden == 2 else g.call("aten::mul.Tensor", [y, y], out=TensorMeta("float32", ("s0", 2)))
    g.set_outputs([z])
    p = Program.single(g)
    p.add_symbol("s0", hint=4, min=1)
    return p


def reference(x, w1, w2):
    h = [[sum(xi * w1[i][j] for i, xi in enumerate(row)) for j in range(len(w1[0]))] for row in x]
    a = [[max(v, 0.0) for v in row] for row in h]
    y = [[sum(av * w2[k][j] for j, av in enumerate(row)) for k in range(len(w2))] for row in a]
    return [[v * v for v in row] for row in y]


def test_flop_count():
    flops = count_flops(mlp())
    # s0 = 4 at its hint: mm 2*4*3*5 + mm 2*4*5*2, relu twice, sigmoid 4 per element, mul once.
    assert flops == {"aten::mm.default": 120 + 80, "aten::relu.default": 40, "aten::sigmoid.default": 80,
                     "aten::t.default": 0, "aten::mul.Tensor": 8}


@pytest.mark.parametrize("seed", range(5))
def test_list_backend_matches_a_plain_python_reference(seed):
    rng = random.Random(seed)
    n = rng.randint(1, 6)
    x = [[rng.uniform(-1, 1) for _ in range(3)] for _ in range(n)]
    w1 = [[rng.uniform(-1, 1) for _ in range(5)] for _ in range(3)]
    w2 = [[rng.uniform(-1, 1) for _ in range(5)] for _ in range(2)]
    (got,) = compile_to_lists(mlp())(x, w1, w2)
    want = reference(x, w1, w2)
    assert all(abs(a - b) < 1e-9 for ra, rb in zip(got, want) for a, b in zip(ra, rb))
    assert len(got) == n


def test_list_backend_refuses_unsupported_ops_up_front():
    g = Graph("main")
    x = g.add_input("x", TensorMeta("float32", (2,)))
    g.set_outputs([g.call("aten::tanh.default", [x], out=TensorMeta("float32", (2,)))])
    with pytest.raises(NotImplementedError, match="aten::tanh.default"):
        compile_to_lists(Program.single(g))


def test_list_backend_matches_the_interpreter():
    torch = pytest.importorskip("torch")
    from fireclay_ir.interpreter import interpret

    torch.manual_seed(0)
    args = [torch.randn(4, 3, dtype=torch.float64), torch.randn(3, 5, dtype=torch.float64),
            torch.randn(2, 5, dtype=torch.float64)]
    (want,) = interpret(mlp(), *args)
    (got,) = compile_to_lists(mlp())(*[a.tolist() for a in args])
    assert torch.allclose(torch.tensor(got, dtype=torch.float64), want)


def test_the_example_imports_nothing_but_fireclay_ir_and_the_standard_library():
    code = (HERE / "backend_example.py").read_text()
    imported = set(re.findall(r"^(?:from|import) ([a-z_]+)", code, re.M))
    assert imported <= {"__future__", "math", "fireclay_ir"}
    out = subprocess.run([sys.executable, "-c", "import sys; sys.path.insert(0, sys.argv[1]); "
                          "import backend_example; assert 'torch' not in sys.modules", str(HERE)],
                         capture_output=True, text=True)
    assert out.returncode == 0, out.stderr


def test_the_doc_shows_the_example_exactly():
    if not DOC.exists():
        pytest.skip("docs/ is not part of this installation")
    blocks = re.findall(r"```python\n(.*?)```", DOC.read_text(), re.S)
    assert (HERE / "backend_example.py").read_text() in blocks


def test_the_usage_snippet_in_the_doc_runs():
    if not DOC.exists():
        pytest.skip("docs/ is not part of this installation")
    blocks = re.findall(r"```python\n(.*?)```", DOC.read_text(), re.S)
    usage = [b for b in blocks if "compile_to_lists(program)" in b and "def compile_to_lists" not in b]
    assert len(usage) == 1
    import backend_example

    exec(compile(usage[0], str(DOC), "exec"), dict(vars(backend_example)))
