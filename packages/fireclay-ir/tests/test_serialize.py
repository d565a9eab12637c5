"""The serializer: canonical round trips, every argument kind, errors by place, versions, bounds."""

from __future__ import annotations

import json
import math
import random
import re
import struct

import pytest
from format_samples import SAMPLES, cond_program, f32, mlp_aten, src, torch_dialect

from fireclay_ir import (
    FORMAT_VERSION,
    Device,
    DType,
    FormatError,
    Graph,
    GraphRef,
    InputSpec,
    IRError,
    Layout,
    Limits,
    MemoryFormat,
    Program,
    ScalarType,
    SymExpr,
    TensorMeta,
    UpgraderRegistry,
    Weight,
    dumps,
    format_program,
    load,
    loads,
    save,
)
from fireclay_ir.serde import weights_path

VARIANTS = [
    ("mlp_static", lambda: mlp_aten(batch=3)),
    ("mlp_symbolic", lambda: mlp_aten(batch="s0", hidden=(8, 8, 8, 4))),
    ("mlp_deep", lambda: mlp_aten(batch="s2", hidden=tuple(range(4, 40, 3)))),
    ("torch_1", lambda: torch_dialect(1)),
    ("torch_5", lambda: torch_dialect(5)),
    ("cond_3", lambda: cond_program(3)),
    ("cond_17", lambda: cond_program(17)),
]


def _doc(prog: Program) -> dict:
    return json.loads(dumps(prog))


def _text(doc: dict) -> str:
    return json.dumps(doc)


@pytest.mark.parametrize("name, build", VARIANTS, ids=[v[0] for v in VARIANTS])
def test_round_trip_is_byte_stable(name, build, tmp_path):
    prog = build()
    text = dumps(prog)
    again = loads(text)
    assert dumps(again) == text
    assert format_program(again) == format_program(prog)
    save(prog, tmp_path / "p.fcir.json")
    loaded = load(tmp_path / "p.fcir.json")
    assert dumps(loaded) == text and format_program(loaded) == format_program(prog)
    assert text.isascii() and text.endswith("}\n")


@pytest.mark.parametrize("name, build", VARIANTS, ids=[v[0] for v in VARIANTS])
def test_round_trip_keeps_structure(name, build):
    prog = build()
    again = loads(dumps(prog))
    assert again.entry == prog.entry and set(again.graphs) == set(prog.graphs)
    assert again.guards == prog.guards and again.metadata == prog.metadata
    assert again.producer == prog.producer and again.dialects == prog.dialects
    assert {k: vars(s) for k, s in again.symbols.items()} == {k: vars(s) for k, s in prog.symbols.items()}
    assert {k: w.meta for k, w in again.weights.items()} == {k: w.meta for k, w in prog.weights.items()}
    for gname, g in prog.graphs.items():
        h = again.graphs[gname]
        assert [(v.name, v.type) for v in h.inputs] == [(v.name, v.type) for v in g.inputs]
        assert h.input_specs == g.input_specs
        assert [n.op for n in h.nodes] == [n.op for n in g.nodes]
        assert [n.meta for n in h.nodes] == [n.meta for n in g.nodes]
        for n, m in zip(g.nodes, h.nodes):
            assert [(o.name, o.type, o.index) for o in m.outputs] == [(o.name, o.type, o.index) for o in n.outputs]
            # use-def links are rebuilt: each reader is recorded on the values it reads
            assert all(m in v.users for v in m.inputs())


def _one_node_program(args, kwargs=None) -> Program:
    g = Graph("main")
    x = g.add_input("x", f32(3))
    g.call("torch::torch.add", [x, *args], kwargs or {}, out=f32(3))
    g.set_outputs([x])
    return Program.single(g)


ARGUMENTS = [
    None, True, False, 0, -1, 2**63 - 1, -(2**63), 0.0, -0.0, 0.1, 1e300, 5e-324, -2.5,
    float("inf"), float("-inf"), "", "text with 'quotes' and \"doubles\"", "ünïcödé ✓ \u0000 \U0001f600", ...,
    [], (), [1, [2, (3,)]], (None, "a"), slice(None, 5, None), slice(1, SymExpr("s0"), -1),
    SymExpr("2*s0 + 1"), DType("bfloat16"), Device("cuda:1"), Layout("sparse_csr"),
    MemoryFormat("channels_last"),
]


@pytest.mark.parametrize("arg", ARGUMENTS, ids=repr)
def test_every_argument_kind_round_trips(arg):
    prog = _one_node_program([arg], {"alpha": arg})
    again = loads(dumps(prog))
    node = again.main.nodes[0]
    for got in (node.args[1], node.kwargs["alpha"]):
        assert type(got) is type(arg)
        assert got == arg
        if isinstance(arg, float):
            assert math.copysign(1, got) == math.copysign(1, arg)


def test_nan_and_value_arguments_round_trip():
    g = Graph("main")
    x = g.add_input("x", f32(3))
    y = g.call("torch::torch.add", [x, float("nan")], {"other": [x, (x,)]}, out=f32(3))
    g.set_outputs([y, [x], 3])
    again = loads(dumps(Program.single(g))).main
    n = again.nodes[0]
    assert math.isnan(n.args[1]) and n.args[0] is again.inputs[0]
    assert n.kwargs["other"][0] is again.inputs[0] and n.kwargs["other"][1][0] is again.inputs[0]
    assert again.outputs == [n.outputs[0], [again.inputs[0]], 3]


def test_same_program_same_bytes_whatever_the_insertion_order():
    rng = random.Random(0)
    texts = set()
    for _ in range(6):
        prog = torch_dialect(3)
        names = list(prog.symbols)
        rng.shuffle(names)
        prog.symbols = {k: prog.symbols[k] for k in names}
        keys = list(prog.metadata)
        rng.shuffle(keys)
        prog.metadata = {k: prog.metadata[k] for k in keys}
        for node in prog.main.nodes:
            kw = list(node.kwargs)
            rng.shuffle(kw)
            node.kwargs = {k: node.kwargs[k] for k in kw}
        texts.add(dumps(prog))
    assert len(texts) == 1


def test_float_formatting_is_fixed():
    doc = _doc(_one_node_program([0.1, 1e300, float("inf"), float("nan"), -0.0, 1.0]))
    args = doc["graphs"]["main"]["nodes"][0]["args"][1:]
    assert args == [{"float": 0.1}, {"float": 1e300}, {"float": "inf"}, {"float": "nan"}, {"float": -0.0},
                    {"float": 1.0}]
    text = dumps(_one_node_program([0.1, 1e300, -0.0, 1.0]))
    assert '{"float": 0.1}, {"float": 1e+300}, {"float": -0.0}, {"float": 1.0}' in text


# --------------------------------------------------------------------------- load errors


def _mutated(mutate, build=torch_dialect) -> str:
    doc = _doc(build())
    mutate(doc)
    return _text(doc)


def _forward(doc):
    return doc["graphs"]["forward"]


LOAD_ERRORS = [
    ("missing entry", lambda d: d.pop("entry"), "", "missing the key 'entry'"),
    ("unknown top key", lambda d: d.update(extra=1), "", "unexpected key 'extra'"),
    ("bad format name", lambda d: d.update(format="onnx"), "format", "expected 'fireclay-ir'"),
    ("entry dangling", lambda d: d.update(entry="nope"), "entry", "names graph 'nope'"),
    ("dangling value", lambda d: _forward(d)["nodes"][1]["args"][0].update(value="ghost"),
     "graphs.forward.nodes[1].args[0].value", "refers to %ghost"),
    ("use before definition", lambda d: _forward(d)["nodes"][0]["args"][0].update(value="v3"),
     "graphs.forward.nodes[0].args[0].value", "not defined before"),
    ("duplicate output name", lambda d: _forward(d)["nodes"][1]["outputs"][0].update(name="v0"),
     "graphs.forward.nodes[1].outputs[0].name", "defined twice"),
    ("duplicate input name", lambda d: _forward(d)["inputs"][1].update(name="x"),
     "graphs.forward.inputs[1].name", "defined twice"),
    ("keyword value name", lambda d: _forward(d)["inputs"][1].update(name="lambda"),
     "graphs.forward.inputs[1].name", "Python identifier"),
    ("two tags", lambda d: _forward(d)["nodes"][0]["args"][0].update(int=1),
     "graphs.forward.nodes[0].args[0]", "tagged argument"),
    ("unknown tag", lambda d: _forward(d)["nodes"][0]["args"].append({"pickle": "x"}),
     "graphs.forward.nodes[0].args[1]", "unknown argument tag 'pickle'"),
    ("int as string", lambda d: _forward(d)["nodes"][7]["args"].__setitem__(1, {"int": "1"}),
     "graphs.forward.nodes[7].args[1].int", "expected an integer"),
    ("bool as int", lambda d: _forward(d)["nodes"][7]["args"].__setitem__(1, {"int": True}),
     "graphs.forward.nodes[7].args[1].int", "expected an integer"),
    ("int too big", lambda d: _forward(d)["nodes"][7]["args"].__setitem__(1, {"int": 2**64}),
     "graphs.forward.nodes[7].args[1].int", "64 bits"),
    ("bad float word", lambda d: _forward(d)["nodes"][4]["args"].__setitem__(2, {"float": "infinity"}),
     "graphs.forward.nodes[4].args[2].float", "'inf', '-inf', 'nan'"),
    ("slice of two", lambda d: _forward(d)["nodes"][3]["args"][1]["tuple"].__setitem__(1, {"slice": []}),
     "graphs.forward.nodes[3].args[1].tuple[1].slice", "three arguments"),
    ("unknown dtype", lambda d: _forward(d)["inputs"][0]["type"]["tensor"].update(dtype="float"),
     "graphs.forward.inputs[0].type.tensor", "unknown dtype 'float'"),
    ("rank mismatch", lambda d: _forward(d)["inputs"][0]["type"]["tensor"].update(strides=[1]),
     "graphs.forward.inputs[0].type.tensor.strides", "1 strides for a rank-2 shape"),
    ("float dim", lambda d: _forward(d)["inputs"][0]["type"]["tensor"]["shape"].__setitem__(0, 1.5),
     "graphs.forward.inputs[0].type.tensor.shape[0]", "int or a symbolic"),
    ("code in a dim", lambda d: _forward(d)["inputs"][0]["type"]["tensor"]["shape"].__setitem__(0, "__import__('os')"),
     "graphs.forward.inputs[0].type.tensor.shape[0]", "characters an expression may not hold"),
    ("code in a guard", lambda d: d["guards"].append("s0.__class__"), "guards[3]", "may not hold"),
    ("bad device", lambda d: _forward(d)["inputs"][1]["type"]["tensor"].update(device="CUDA 0"),
     "graphs.forward.inputs[1].type.tensor", "malformed device"),
    ("bad scalar kind", lambda d: _forward(d)["inputs"][3].update(type={"scalar": "complex"}),
     "graphs.forward.inputs[3].type.scalar", "unknown scalar kind"),
    ("malformed op", lambda d: _forward(d)["nodes"][0].update(op="os.system"),
     "graphs.forward.nodes[0].op", "malformed op name"),
    ("unknown dialect", lambda d: _forward(d)["nodes"][0].update(op="evil::system"),
     "graphs.forward.nodes[0].op", "unknown op 'evil::system'"),
    ("dangling graph ref", lambda d: _forward(d)["nodes"][0]["args"].append({"graph": "elsewhere"}),
     "graphs.forward.nodes[0].args[1].graph", "refers to graph 'elsewhere'"),
    ("parameter without weight", lambda d: _forward(d)["inputs"][0].update(spec={"kind": "parameter", "target": "w"}),
     "graphs.forward.inputs[0].spec.target", "not among the document's weights"),
    ("user with target", lambda d: (d["weights"].update(w=d["weights"].get("w", {"type": _forward(d)["inputs"][0]["type"]})),
                                    _forward(d)["inputs"][0].update(spec={"kind": "user", "target": "w"})),
     "graphs.forward.inputs[0].spec", "takes no target"),
    ("bad source", lambda d: _forward(d)["nodes"][0]["meta"]["source"].update(line="3"),
     "graphs.forward.nodes[0].meta.source.line", "a line number"),
    ("symbol hint float", lambda d: d["symbols"]["s0"].update(hint=8.0), "symbols.s0.hint", "integer or null"),
    ("no graphs", lambda d: d.update(graphs={}), "graphs", "at least one graph"),
    ("nodes not a list", lambda d: _forward(d).update(nodes={}), "graphs.forward.nodes", "expected a list of nodes"),
    ("weight scalar type", lambda d: d["weights"].update(w={"type": {"scalar": "int"}}), "weights.w.type",
     "tensor type"),
    ("kwargs list", lambda d: _forward(d)["nodes"][0].update(kwargs=[]), "graphs.forward.nodes[0].kwargs",
     "object of keyword arguments"),
    ("meta nan", lambda d: None, "", None),
]


@pytest.mark.parametrize("name, mutate, where, message", LOAD_ERRORS, ids=[e[0] for e in LOAD_ERRORS])
def test_load_errors_name_the_place(name, mutate, where, message):
    if message is None:
        with pytest.raises(FormatError, match="literal NaN"):
            loads('{"format_version": "1.0", "x": NaN}')
        return
    with pytest.raises(FormatError) as info:
        loads(_mutated(mutate))
    assert info.value.where == where
    assert message in info.value.problem
    assert str(info.value).startswith(f"{where}: " if where else message[:5])


@pytest.mark.parametrize("text, message", [
    ("", "not valid JSON"),
    ("[]", "a JSON object"),
    ("{}", "missing the key 'format_version'"),
    ('{"format_version": "1.0", "format_version": "1.0"}', "appears twice"),
    ('{"format_version": 1.0}', "version string"),
    ('{"format_version": "1"}', "version string"),
    ('{"format_version": "01.0"}', "version string"),
    ("[" * 5000 + "]" * 5000, "nests deeper"),
    ('{"a": "[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[["}',
     "missing the key 'format_version'"),
])
def test_malformed_text(text, message):
    with pytest.raises(FormatError, match=message):
        loads(text)


def test_loader_never_accepts_non_text():
    with pytest.raises(FormatError, match="as text"):
        loads(b"{}")  # type: ignore[arg-type]


@pytest.mark.parametrize("limits, message", [
    (Limits(max_document_chars=100), "characters, above the limit"),
    (Limits(max_nesting=5), "nests deeper"),
    (Limits(max_nodes=3), "more than 3 nodes"),
    (Limits(max_values=4), "more than 4 values"),
    (Limits(max_string_chars=10), "longer than the limit 10"),
    (Limits(max_name_chars=3), "longer than the limit 3"),
    (Limits(max_rank=1), "rank 2 is above the limit 1"),
    (Limits(max_symbols=1), "above the limit 1"),
    (Limits(max_guards=2), "above the limit 2"),
])
def test_bounds(limits, message):
    text = dumps(torch_dialect(2))
    loads(text)  # fine with the default limits
    with pytest.raises(FormatError, match=message):
        loads(text, limits=limits)


def test_bounds_hold_for_writing_too():
    with pytest.raises(FormatError, match="rank 3 is above the limit 2"):
        dumps(Program.single(_graph_with_input(f32(1, 2, 3))), limits=Limits(max_rank=2))
    with pytest.raises(FormatError, match="longer than the limit 4"):
        dumps(Program.single(_graph_with_input(f32("s0*s1 + 1"))), limits=Limits(max_string_chars=4))


def _graph_with_input(t: TensorMeta) -> Graph:
    g = Graph("main")
    g.set_outputs([g.add_input("x", t)])
    return g


@pytest.mark.parametrize("op", [
    "torch::torch.__class__", "torch::torch.os.system", "torch::torch._C._get_tracing_state", "torch::torch.load",
    "torch::operator.__call__", "torch::math.__loader__.load_module", "torch::Tensor.__reduce_ex__",
    "torch::torch.nn.functional.torch.load", "aten::__getattribute__.default", "hop::cond.x", "builtins::eval",
    "os::system",
])
def test_ops_resolve_only_against_the_registries(op):
    """A document cannot name an import path or a private attribute as its op."""
    g = Graph("main")
    x = g.add_input("x", f32(2))
    g.call(op, [x], out=f32(2))
    g.set_outputs([x])
    with pytest.raises(FormatError, match=rf"graphs\.main\.nodes\[0\]\.op: unknown op '{re.escape(op)}'"):
        loads(dumps(Program.single(g)))


def test_unknown_registered_op_is_a_load_error():
    g = Graph("main")
    x = g.add_input("x", f32(3))
    y = g.call("aten::definitely_not_an_op.default", [x], out=f32(3))
    g.set_outputs([y])
    text = dumps(Program.single(g))  # writing does not consult the registries
    with pytest.raises(FormatError, match=r"graphs\.main\.nodes\[0\]\.op: unknown op 'aten::definitely_not"):
        loads(text)
    assert loads(text, check_ops=False, verify=False).main.nodes[0].op == "aten::definitely_not_an_op.default"


# --------------------------------------------------------------------------- writing errors


@pytest.mark.parametrize("make, where, message", [
    (lambda g, x: g.call("torch::torch.add", [x, object()], out=f32(3)), "graphs.main.nodes[0].args[1]",
     "cannot serialize an argument of type builtins.object"),
    (lambda g, x: g.call("torch::torch.add", [x, 2**70], out=f32(3)), "graphs.main.nodes[0].args[1]", "64 bits"),
    (lambda g, x: g.call("torch::torch.add", [x, GraphRef("missing")], out=f32(3)), "graphs.main.nodes[0].args[1]",
     "refers to graph 'missing'"),
    (lambda g, x: g.call("torch::torch.add", [x, {"k": x}], out=f32(3)), "graphs.main.nodes[0].args[1]",
     "cannot serialize an argument of type builtins.dict"),
    (lambda g, x: g.call("torch::torch.add", [x], meta={"bad": float("nan")}, out=f32(3)),
     "graphs.main.nodes[0].meta.bad", "non-finite"),
    (lambda g, x: g.call("torch::torch.add", [x], meta={"bad": {1, 2}}, out=f32(3)),
     "graphs.main.nodes[0].meta.bad", "plain JSON data"),
    (lambda g, x: g.call("torch::torch.add", [x, Graph("other").add_input("y", f32(3))], out=f32(3)),
     "graphs.main.nodes[0].args[1]", "%y is not defined in this graph"),
])
def test_write_errors_name_the_place(make, where, message):
    g = Graph("main")
    x = g.add_input("x", f32(3))
    make(g, x)
    with pytest.raises(FormatError) as info:
        dumps(Program.single(g))
    assert info.value.where == where and message in info.value.problem


def test_writer_rejects_a_parameter_without_its_weight():
    g = Graph("main")
    g.set_outputs([g.add_input("w", f32(3), InputSpec("parameter", "fc.w"))])
    with pytest.raises(FormatError, match="not among the program's weights"):
        dumps(Program.single(g))


# --------------------------------------------------------------------------- versions


def _with_version(version: str) -> str:
    doc = _doc(torch_dialect())
    doc["format_version"] = version
    return _text(doc)


def test_newer_major_names_both_versions():
    with pytest.raises(FormatError, match=r"format 2\.0, but this fireclay-ir reads format 1\.0"):
        loads(_with_version("2.0"))


def test_newer_minor_is_refused_unless_allowed():
    doc = _doc(torch_dialect())
    doc["format_version"] = f"{FORMAT_VERSION[0]}.{FORMAT_VERSION[1] + 1}"
    doc["new_optional_field"] = {"anything": 1}
    doc["graphs"]["forward"]["nodes"][0]["future"] = True
    text = _text(doc)
    with pytest.raises(FormatError, match=r"format 1\.1, newer than format 1\.0.*allow_newer_minor"):
        loads(text)
    prog = loads(text, allow_newer_minor=True)
    assert prog.format_version == FORMAT_VERSION
    assert dumps(prog) == dumps(torch_dialect())


def test_older_major_without_upgrader_names_both_versions():
    with pytest.raises(FormatError, match=r"format 0\.3, this fireclay-ir reads format 1\.x and has no upgrader "
                                          r"from 0\.x"):
        loads(_with_version("0.3"))


def _v0_document(prog: Program) -> str:
    """A synthetic format 0.3 document: what format 1 might have looked like before its release.
    Version 0 called the entry "main_graph", kept the graph list under "functions" and wrote tensor
    types as flat ["dtype", [shape]] pairs."""
    doc = _doc(prog)
    doc["format_version"] = "0.3"
    doc["main_graph"] = doc.pop("entry")
    doc["functions"] = doc.pop("graphs")

    def flatten(t):
        if "tensor" in t:
            return [t["tensor"]["dtype"], t["tensor"]["shape"]]
        return t

    for g in doc["functions"].values():
        for item in g["inputs"]:
            item["type"] = flatten(item["type"])
        for node in g["nodes"]:
            for o in node["outputs"]:
                o["type"] = flatten(o["type"])
    for w in doc["weights"].values():
        w["type"] = flatten(w["type"])
    return _text(doc)


def _upgrade_0_to_1(doc: dict) -> dict:
    def unflatten(t):
        if isinstance(t, list):
            dtype, shape = t
            return {"tensor": {"dtype": dtype, "shape": shape, "strides": None, "storage_offset": 0,
                               "device": "cpu", "requires_grad": False}}
        return t

    doc["entry"] = doc.pop("main_graph")
    doc["graphs"] = doc.pop("functions")
    for g in doc["graphs"].values():
        for item in g["inputs"]:
            item["type"] = unflatten(item["type"])
        for node in g["nodes"]:
            for o in node["outputs"]:
                o["type"] = unflatten(o["type"])
    for w in doc["weights"].values():
        w["type"] = unflatten(w["type"])
    return doc


@pytest.mark.parametrize("build", [lambda: mlp_aten(batch=5), lambda: mlp_aten("s0", (4, 4)), cond_program],
                         ids=["mlp_static", "mlp_sym", "cond"])
def test_upgrader_reads_a_synthetic_0x_document(build):
    registry = UpgraderRegistry()
    registry.register(0, _upgrade_0_to_1)
    prog = build()
    # The 0.x writer knew only plain CPU tensors, which is all these programs hold but strides.
    for g in prog.graphs.values():
        for n in g.nodes:
            for o in n.outputs:
                o.type = o.type.with_(strides=None)
    upgraded = loads(_v0_document(prog), upgraders=registry)
    assert upgraded.format_version == (1, 0)
    assert dumps(upgraded) == dumps(prog)


def test_upgrader_failures_are_format_errors():
    registry = UpgraderRegistry()
    registry.register(0, lambda doc: doc["no such key"])
    with pytest.raises(FormatError, match=r"upgrading the document from format 0\.x to 1\.0 failed: KeyError"):
        loads(_with_version("0.3"), upgraders=registry)
    bad = UpgraderRegistry()
    bad.register(0, lambda doc: dict(doc, format_version="3.0"))
    with pytest.raises(FormatError, match=r"produced format 3\.0, expected 1\.x"):
        loads(_with_version("0.1"), upgraders=bad)
    with pytest.raises(ValueError, match="already registered"):
        bad.register(0, _upgrade_0_to_1)


# --------------------------------------------------------------------------- files and weights


def _float_bytes(values) -> bytes:
    return struct.pack(f"<{len(values)}f", *values)


def test_save_load_weights_as_bytes(tmp_path):
    prog = mlp_aten(batch=2, hidden=(3, 2))
    rng = random.Random(1)
    expected = {}
    for name, w in prog.weights.items():
        expected[name] = _float_bytes([rng.uniform(-1, 1) for _ in range(math.prod(w.meta.shape))])
        w.data = expected[name]
    path = tmp_path / "m.fcir.json"
    save(prog, path)
    assert weights_path(path) == str(tmp_path / "m.fcir.safetensors")
    back = load(path, weights="bytes")
    assert {k: w.data for k, w in back.weights.items()} == expected
    assert all(w.data is None for w in load(path, weights="none").weights.values())
    # Saving without data removes the stale weights file, so it cannot be mistaken for these.
    save(load(path, weights="none"), path)
    assert not (tmp_path / "m.fcir.safetensors").exists()
    assert all(w.data is None for w in load(path, weights="bytes").weights.values())


def test_partial_weights_and_mismatches(tmp_path):
    prog = mlp_aten(batch=2, hidden=(3, 2))
    prog.weights["fc0.bias"].data = _float_bytes([1.0, 2.0])
    path = tmp_path / "m.fcir.json"
    save(prog, path)
    back = load(path, weights="bytes")
    assert back.weights["fc0.bias"].data == _float_bytes([1.0, 2.0]) and back.weights["fc0.weight"].data is None
    prog.weights["fc0.bias"].data = b"\x00" * 3
    with pytest.raises(FormatError, match=r"weights\.fc0\.bias: a float32 tensor of shape \[2\] needs 8 bytes"):
        save(prog, path)
    # A document edited to declare another shape no longer matches its weights file.
    text = (tmp_path / "m.fcir.json").read_text().replace('"shape": [2]', '"shape": [1, 2]')
    (tmp_path / "m.fcir.json").write_text(text)
    with pytest.raises(FormatError, match="the file holds float32\\[2\\] but the document declares"):
        load(path, weights="bytes", verify=False)


def test_weight_data_needs_a_static_shape(tmp_path):
    g = Graph("main")
    g.set_outputs([g.add_input("w", f32("s0"), InputSpec("buffer", "buf"))])
    prog = Program.single(g, weights={"buf": Weight(f32("s0"), b"")})
    with pytest.raises(FormatError, match="static shape"):
        save(prog, tmp_path / "x.fcir.json")


def test_load_rejects_non_utf8(tmp_path):
    (tmp_path / "x.fcir.json").write_bytes(b"\xff\xfe{}")
    with pytest.raises(FormatError, match="not UTF-8"):
        load(tmp_path / "x.fcir.json")


def test_errors_are_ir_errors_and_can_be_copied():
    """Copying goes through __reduce__, as sending the error to another process does."""
    import copy

    assert issubclass(FormatError, IRError)
    err = copy.deepcopy(FormatError("graphs.main.nodes[0]", "expected x"))
    assert (err.where, err.problem, str(err)) == ("graphs.main.nodes[0]", "expected x", "graphs.main.nodes[0]: expected x")


def test_samples_cover_every_argument_tag():
    tags = set()

    def walk(x):
        if isinstance(x, dict):
            if len(x) == 1:
                tags.update(x)
            for v in x.values():
                walk(v)
        elif isinstance(x, list):
            for v in x:
                walk(v)

    for build in SAMPLES.values():
        for g in _doc(build())["graphs"].values():
            walk([n["args"] for n in g["nodes"]] + [n["kwargs"] for n in g["nodes"]])
    assert tags >= {"value", "none", "ellipsis", "bool", "int", "float", "str", "list", "tuple", "slice", "sym",
                    "dtype", "device", "layout", "memory_format", "graph"}


def test_scalar_outputs_and_symbols():
    prog = torch_dialect()
    again = loads(dumps(prog))
    assert again.main.nodes[-1].output.type == ScalarType("float")
    assert again.symbols["s1"].max is None and again.symbols["s0"].max == 1024
    assert again.main.inputs[1].type == TensorMeta("bfloat16", ("s1",), device="cuda:0")
    assert again.main.nodes[0].meta == src(3, "a = F.gelu(x, approximate='tanh')", "model.py")


def test_the_example_node_in_the_format_docs_loads():
    """docs/format/README.md's example node is a real node of a loadable document."""
    import pathlib

    readme = pathlib.Path(__file__).resolve().parents[3] / "docs" / "format" / "README.md"
    if not readme.exists():
        pytest.skip("docs/format is not part of this checkout")
    example = readme.read_text(encoding="utf-8").split("Example node:\n\n```json\n")[1].split("```")[0]
    g = Graph("main")
    g.set_outputs([g.add_input("x", f32(2, "s0", 3))])
    doc = _doc(Program.single(g))
    doc["graphs"]["main"]["nodes"] = [json.loads(example)]
    doc["graphs"]["main"]["outputs"] = [{"value": "y"}]
    node = loads(_text(doc)).main.nodes[0]
    assert node.op == "torch::torch.sum" and node.kwargs == {"dtype": DType("float64"), "keepdim": True}
    assert node.args[1] == [0, -1] and node.output.type == TensorMeta("float64", (1, "s0", 1))


@pytest.mark.parametrize("kind", ["list", "tuple", "slice", "meta", "graph_meta", "metadata", "output"])
def test_writer_refuses_exactly_what_the_reader_would(kind):
    """Around the nesting bound, a document either fails to write or loads: never written, then refused."""
    outcomes = set()
    for levels in range(35, 110, 3):
        g = Graph("main")
        x = g.add_input("x", f32(3))
        nested: object = x if kind in ("list", "tuple", "slice", "output") else 1
        for _ in range(levels):
            nested = {"list": [nested], "tuple": (nested,), "slice": slice(nested, None, None), "output": [nested],
                      "meta": {"k": nested}, "graph_meta": [nested], "metadata": {"k": nested}}[kind]
        if kind in ("list", "tuple", "slice"):
            g.call("torch::torch.add", [x, nested], out=f32(3))
        elif kind == "meta":
            g.call("torch::torch.add", [x], meta={"deep": nested}, out=f32(3))
        elif kind == "graph_meta":
            g.meta["deep"] = nested
        g.set_outputs([nested] if kind == "output" else [x])
        prog = Program.single(g, metadata={"deep": nested} if kind == "metadata" else {})
        try:
            text = dumps(prog)
        except FormatError as exc:
            assert "nested deeper than the limit" in exc.problem
            outcomes.add("refused")
            continue
        loads(text, verify=False)
        outcomes.add("written")
    assert outcomes == {"refused", "written"}


def _small_program() -> Program:
    g = Graph("main")
    x = g.add_input("x", f32(3))
    g.set_outputs([g.call("torch::torch.add", [x, 1], out=f32(3))])
    return Program.single(g)


def _rename_graph(prog: Program, name: str) -> None:
    g = prog.graphs.pop("main")
    g.name = name
    prog.graphs[name] = g
    prog.entry = name


@pytest.mark.parametrize("spoil, where, message", [
    (lambda p: p.main.inputs[0].__setattr__("type", f32("s0'")), "graphs.main.inputs[0].type.shape[0]",
     "characters an expression may not hold"),
    (lambda p: p.main.set_args(p.main.nodes[0], [p.main.inputs[0], SymExpr("s0.__class__")]),
     "graphs.main.nodes[0].args[1]", "characters an expression may not hold"),
    (lambda p: p.guards.append("s0; import os"), "guards[0]", "characters an expression may not hold"),
    (lambda p: p.guards.append(3), "guards[0]", "expected a string"),
    (lambda p: _rename_graph(p, "if"), "graphs.if", "a graph name must be a Python identifier"),
    (lambda p: p.add_symbol("s-0", 3), "symbols.s-0", "a symbol name must be a Python identifier"),
    (lambda p: p.dialects.update({"aten": 1}), "dialects.aten", "expected a string"),
    (lambda p: setattr(p, "producer", ("x", 1)), "producer", "expected (name, version) strings"),
    (lambda p: p.main.nodes[0].kwargs.update({"lambda": 1}), "graphs.main.nodes[0].kwargs",
     "a keyword name must be a Python identifier"),
    (lambda p: p.main.nodes[0].outputs[0].__setattr__("name", "class"), "graphs.main.nodes[0].outputs[0]",
     "a value name must be a Python identifier"),
    (lambda p: p.weights.update({"": Weight(f32(1))}), "weights", "non-empty string"),
])
def test_writer_refuses_what_the_reader_would_refuse(spoil, where, message):
    prog = _small_program()
    spoil(prog)
    with pytest.raises(FormatError) as info:
        dumps(prog)
    assert info.value.where == where and message in info.value.problem
