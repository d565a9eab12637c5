"""The text printer: types, arguments, source comments, layout."""

from __future__ import annotations

import pytest
from format_samples import SAMPLES, f32, mlp_aten, src

from fireclay_ir import (
    Device,
    DType,
    Graph,
    GraphRef,
    InputSpec,
    MemoryFormat,
    Program,
    ScalarType,
    SymExpr,
    TensorMeta,
    Weight,
    format_graph,
    format_program,
)
from fireclay_ir.printer import contiguous_strides, format_arg, format_type


@pytest.mark.parametrize("meta, text", [
    (TensorMeta("float32", ("s0", 128)), "f32[s0, 128]"),
    (TensorMeta("bfloat16", ()), "bf16[]"),
    (TensorMeta("int64", (3,)), "i64[3]"),
    (TensorMeta("bool", (2, 2)), "b8[2, 2]"),
    (TensorMeta("uint8", (1,)), "u8[1]"),
    (TensorMeta("complex64", (1,)), "c64[1]"),
    (TensorMeta("float8_e4m3fn", (1,)), "f8e4m3fn[1]"),
    (TensorMeta("float32", (4, 8), strides=(8, 1)), "f32[4, 8]"),
    (TensorMeta("float32", (4, 8), strides=(1, 4)), "f32[4, 8]{strides=(1, 4)}"),
    (TensorMeta("float32", (4, 1), strides=(1, 77)), "f32[4, 1]"),  # size-1 strides never matter
    (TensorMeta("float32", (4,), strides=(2,)), "f32[4]{strides=(2,)}"),
    (TensorMeta("float32", ("s0", "s1", 3), strides=("3*s1", 3, 1)), "f32[s0, s1, 3]"),
    (TensorMeta("float32", ("s0", "s1 + 1"), strides=("s1 + 1", 1)), "f32[s0, s1 + 1]"),
    (TensorMeta("float32", (4, 4), storage_offset=2), "f32[4, 4]{offset=2}"),
    (TensorMeta("float16", (4,), device="cuda:0", requires_grad=True), "f16[4]{cuda:0, requires_grad}"),
    (TensorMeta("float32", (2, 3), strides=(1, 2), storage_offset="s0", device="cuda:1"),
     "f32[2, 3]{strides=(1, 2), offset=s0, cuda:1}"),
    (ScalarType("int"), "int"),
    (ScalarType("opaque"), "opaque"),
])
def test_format_type(meta, text):
    assert format_type(meta) == text


@pytest.mark.parametrize("shape, strides", [
    ((), []), ((5,), [1]), ((2, 3, 4), [12, 4, 1]), (("s0", 4), [4, 1]), ((4, "s0"), ["s0", 1]),
    ((2, "s0", "s1"), ["s0*s1", "s1", 1]), ((3, "s0", 2), ["2*s0", 2, 1]), (("a + 1", 2), [2, 1]),
    ((2, "a + 1"), ["a + 1", 1]), ((2, "a + 1", "b"), ["(a + 1)*b", "b", 1]),
])
def test_contiguous_strides(shape, strides):
    assert contiguous_strides(shape) == strides


@pytest.mark.parametrize("arg, text", [
    (None, "None"), (True, "True"), (3, "3"), (-0.0, "-0.0"), (float("inf"), "inf"), (float("nan"), "nan"),
    ("a'b", '"a\'b"'), (..., "..."), ([1, (2,)], "[1, (2,)]"), ((), "()"), ((1, 2), "(1, 2)"),
    (slice(None, 3, None), "slice(None, 3, None)"), (SymExpr("2*s0"), "2*s0"), (DType("float32"), "torch.float32"),
    (Device("cuda:0"), "device('cuda:0')"), (MemoryFormat("channels_last"), "torch.channels_last"),
    (GraphRef("body"), "@body"),
])
def test_format_arg(arg, text):
    assert format_arg(arg) == text


def test_the_example_from_the_issue():
    g = Graph("main")
    x = g.add_input("x", f32("s0", 128))
    w = g.add_input("w", f32(128, 64), InputSpec("parameter", "fc.weight"))
    g.call("aten::mm.default", [x, w], out=f32("s0", 64), meta=src(12, "y = x @ w", "model.py"))
    assert format_graph(g).splitlines()[:3] == [
        'graph main(x: f32[s0, 128], w: f32[128, 64] = param "fc.weight"):',
        "    # model.py:12: y = x @ w",
        "    v0: f32[s0, 64] = aten.mm.default(x, w)",
    ]


def test_source_comment_only_when_the_source_changes():
    g = Graph("main")
    x = g.add_input("x", f32(2))
    lines = [(1, "a"), (1, "a"), (2, "b"), None, (2, "b"), (1, "a")]
    for item in lines:
        meta = src(item[0], item[1], "/deep/path/to/file.py") if item else {}
        x = g.call("aten::neg.default", [x], out=f32(2), meta=meta)
    g.set_outputs([x])
    body = format_graph(g).splitlines()[1:]
    comments = [line.strip() for line in body if line.strip().startswith("#")]
    assert comments == ["# file.py:1: a", "# file.py:2: b", "# file.py:2: b", "# file.py:1: a"]
    assert body[-1] == "    return (v5,)"


def test_nodes_without_outputs_and_multiple_outputs():
    g = Graph("main")
    x = g.add_input("x", f32(3))
    mean, var = g.call("aten::var_mean.correction", [x], {"correction": 0, "keepdim": False}, out=[f32(), f32()])
    g.call("aten::copy_.default", [x, x])
    g.set_outputs([mean, var])
    lines = format_graph(g).splitlines()
    assert lines[1] == "    v0: f32[], v1: f32[] = aten.var_mean.correction(x, correction=0, keepdim=False)"
    assert lines[2] == "    aten.copy_.default(x, x)"
    assert lines[3] == "    return (v0, v1)"


def test_long_signatures_wrap_one_input_per_line():
    text = format_program(mlp_aten(hidden=(8, 8, 8, 8)))
    start = text.index("graph main(\n")
    header = text[start:text.index("):\n", start) + 3].splitlines()
    assert header[1] == "    x: f32[s0, 8],"
    assert header[2] == '    fc0_weight: f32[8, 8] = param "fc0.weight",'
    assert header[-1] == "):"


def test_program_header_and_graph_order():
    prog = SAMPLES["cond"]()
    prog.add_symbol("u0", None, 0, None)
    prog.guards.append("u0 >= 0")
    prog.weights["c"] = Weight(TensorMeta("int64", (2,)))
    lines = format_program(prog).splitlines()
    assert lines[0] == "# fireclay-ir format 1.0, produced by fireclay-capture 0.1.0"
    assert lines[1] == "# dialects: aten 1, hop 1"
    assert lines[2:8] == ["symbols:", "    u0 in [0, inf]", "guards:", "    u0 >= 0", "weights:", "    'c': i64[2]"]
    graphs = [line for line in lines if line.startswith("graph ")]
    assert [g.split("(")[0] for g in graphs] == ["graph main", "graph false_branch", "graph true_branch"]
    assert lines[lines.index(graphs[0]) - 1] == "# entry"


def test_str_uses_the_printer():
    prog = SAMPLES["torch_dialect"]()
    assert str(prog) == format_program(prog)
    assert str(prog.main) == format_graph(prog.main)
    assert "    v7: int = Tensor.size(x, 1)" in str(prog)


def test_input_kinds_print_their_targets():
    g = Graph("main")
    for kind, name in (("parameter", "w"), ("buffer", "bn.m"), ("constant", 'c"0')):
        g.add_input(name, f32(2), InputSpec(kind, name))
    prog = Program.single(g, weights={n: Weight(f32(2)) for n in ("w", "bn.m", 'c"0')})
    assert format_graph(prog.main).splitlines()[0] == (
        'graph main(w: f32[2] = param "w", bn_m: f32[2] = buffer "bn.m", c_0: f32[2] = constant "c\\"0"):')


def test_the_text_form_shown_in_the_format_docs():
    """docs/format/README.md shows real printer output."""
    import pathlib

    readme = pathlib.Path(__file__).resolve().parents[3] / "docs" / "format" / "README.md"
    if not readme.exists():
        pytest.skip("docs/format is not part of this checkout")
    text = readme.read_text(encoding="utf-8")
    shown = text.split("## The text form")[1].split("```\n")[1]
    g = Graph("main")
    x = g.add_input("x", f32("s0", 128))
    w = g.add_input("w", f32(64, 128), InputSpec("parameter", "fc.weight"))
    meta = src(12, "y = self.fc(x)", "model.py")
    wt = g.call("aten::t.default", [w], out=f32(128, 64, strides=(1, 128)), meta=meta)
    g.set_outputs([g.call("aten::mm.default", [x, wt], out=f32("s0", 64), meta=meta)])
    prog = Program.single(g, weights={"fc.weight": Weight(f32(64, 128))}, producer=("fireclay-autograd", "0.1.0"),
                          dialects={"aten": "1"})
    prog.add_symbol("s0", 4, 2, None)
    prog.guards.append("s0 >= 2")
    assert format_program(prog) == shown


def test_command_line_prints_saved_programs(tmp_path, capsys):
    from fireclay_ir import save
    from fireclay_ir.serde.__main__ import main

    prog = SAMPLES["cond"]()
    save(prog, tmp_path / "c.fcir.json")
    (tmp_path / "bad.fcir.json").write_text('{"format_version": "9.0"}')
    assert main([str(tmp_path / "c.fcir.json")]) == 0
    assert capsys.readouterr().out == format_program(prog)
    assert main([str(tmp_path / "bad.fcir.json"), str(tmp_path / "missing.fcir.json")]) == 1
    err = capsys.readouterr().err
    assert "format 9.0, but this fireclay-ir reads format 1.0" in err and "missing.fcir.json" in err
    assert main([]) == 2
