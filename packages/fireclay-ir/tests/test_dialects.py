"""Dialect registries: lookup, schemas from the shipped data, the torch allow-list, hop."""

from __future__ import annotations

import subprocess
import sys

import pytest

from fireclay_ir import IRError
from fireclay_ir.dialects import (
    NO_DEFAULT,
    Dialect,
    OpDef,
    core_ops,
    get_dialect,
    lookup_op,
    register_dialect,
    shipped_ops,
)
from fireclay_ir.dialects.aten import parse_schema


def test_aten_lookup_works_without_importing_torch():
    code = ("import sys; from fireclay_ir.dialects import lookup_op; "
            "op = lookup_op('aten::native_layer_norm.default'); "
            "assert len(op.returns) == 3, op; assert 'torch' not in sys.modules; print(op.schema)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert "native_layer_norm" in out.stdout


@pytest.mark.parametrize("name, n_args, mutates, view, pure", [
    ("aten::add.Tensor", 3, (), False, True),
    ("aten::add_.Tensor", 3, ("self",), False, False),
    ("aten::view.default", 2, (), True, True),
    ("aten::copy_.default", 3, ("self",), False, False),
    ("aten::convolution.default", 9, (), False, True),
    ("aten::_to_copy.default", 7, (), False, True),
    ("aten::addmm.default", 5, (), False, True),
    # dropout_p makes attention random: never merged.
    ("aten::scaled_dot_product_attention.default", 8, (), False, False),
    ("aten::embedding.default", 5, (), False, True),
    ("aten::split.Tensor", 3, (), True, True),
    ("aten::index_put_.default", 4, ("self",), False, False),
    ("aten::_assert_async.msg", 2, (), False, False),
])
def test_aten_schemas(name, n_args, mutates, view, pure):
    op = lookup_op(name)
    assert len(op.arguments) == n_args
    assert op.mutates == mutates
    assert op.is_view == view
    assert op.is_pure == pure


def test_aten_arguments_carry_types_defaults_and_kwarg_only():
    op = lookup_op("aten::add.Tensor")
    alpha = op.arguments[2]
    assert (alpha.name, alpha.type, alpha.default, alpha.kwarg_only) == ("alpha", "Scalar", 1, True)
    assert op.arguments[0].default is NO_DEFAULT
    sum_dim = lookup_op("aten::sum.dim_IntList")
    assert [a.type for a in sum_dim.arguments] == ["Tensor", "int[1]?", "bool", "ScalarType?"]
    assert sum_dim.arguments[2].default is False


def test_core_op_set_is_documented_data():
    core = core_ops()
    assert len(core) > 150
    for name in ("aten::add.Tensor", "aten::mm.default", "aten::_softmax.default", "aten::native_layer_norm.default"):
        assert name in core
    assert "aten::add_.Tensor" not in core  # in-place variants are shipped, not core
    assert set(core) <= set(shipped_ops())
    assert all("core" in lookup_op(n).tags for n in core[:40])


def test_random_ops_are_nondeterministic():
    assert lookup_op("aten::rand.default").nondeterministic
    assert not lookup_op("aten::rand.default").is_pure
    assert lookup_op("aten::relu.default").is_pure


@pytest.mark.parametrize("schema, names, types, rets", [
    ("aten::foo(Tensor self, *, Scalar alpha=1) -> Tensor", ["self", "alpha"], ["Tensor", "Scalar"], 1),
    ("aten::foo.x(Tensor(a!) self, int[2] k=[1, 1], str mode=\"a,b\") -> (Tensor(a!) out, Tensor idx)",
     ["self", "k", "mode"], ["Tensor", "int[2]", "str"], 2),
    ("aten::foo(Tensor?[] indices, float? eps=1e-05) -> ()", ["indices", "eps"], ["Tensor?[]", "float?"], 0),
    ("aten::foo(Tensor(a -> *) self) -> Tensor(a)[]", ["self"], ["Tensor"], 1),
])
def test_schema_parser(schema, names, types, rets):
    _, args, returns = parse_schema(schema)
    assert [a.name for a in args] == names
    assert [a.type for a in args] == types
    assert len(returns) == rets


def test_schema_parser_defaults():
    _, args, _ = parse_schema('aten::f(int[2] k=[1, 1], str mode="a,b", float e=1e-05, bool b=True, '
                              'MemoryFormat m=contiguous_format, int? n=None) -> Tensor')
    assert [a.default for a in args] == [[1, 1], "a,b", 1e-05, True, "contiguous_format", None]


@pytest.mark.parametrize("bad", [
    "aten::nope.default", "aten::add.NoSuchOverload", "aten::../etc", "nodialect::x", "loops::load",
    "torch::os.system", "torch::torch.load", "torch::torch.save", "torch::operator.attrgetter",
    "torch::Tensor.__reduce_ex__", "torch::torch._C._nn.gelu", "torch::builtins.eval", "add", "::x",
])
def test_unknown_or_forbidden_ops_raise_irerror(bad):
    with pytest.raises(IRError):
        lookup_op(bad)


def test_reserved_loops_dialect_explains_itself():
    with pytest.raises(IRError, match="fireclay-loops"):
        get_dialect("loops")


def test_unknown_op_suggests_overloads():
    with pytest.raises(IRError, match=r"did you mean .*aten::add.Tensor"):
        lookup_op("aten::add.Tensr")


def test_a_new_dialect_registers_through_the_public_api():
    d = Dialect("testdialect_a", "3")
    d.register(OpDef(dialect="testdialect_a", name="load", side_effects=False))
    register_dialect(d)
    assert lookup_op("testdialect_a::load").qualified_name == "testdialect_a::load"
    with pytest.raises(IRError, match="already registered"):
        d.register(OpDef(dialect="testdialect_a", name="load"))
    with pytest.raises(IRError, match="already registered"):
        register_dialect(Dialect("testdialect_a"))
    with pytest.raises(IRError):
        d.register(OpDef(dialect="other", name="x"))


def test_hop_dialect_ops():
    for name in ("cond", "while_loop", "checkpoint"):
        op = lookup_op(f"hop::{name}")
        assert op.arguments and op.doc


# ---------------------------------------------------------------- with torch


def test_torch_names_resolve_under_allowed_roots():
    torch = pytest.importorskip("torch")
    import math
    import operator

    cases = {
        "torch.add": torch.add, "torch.nn.functional.gelu": torch.nn.functional.gelu,
        "operator.add": operator.add, "math.sqrt": math.sqrt, "torch.special.erf": torch.special.erf,
        "torch.linalg.norm": torch.linalg.norm, "torch.fft.fft": torch.fft.fft,
        "Tensor.view": torch.Tensor.view,
    }
    for name, fn in cases.items():
        op = lookup_op(f"torch::{name}")
        assert op.target() is fn, name
    assert lookup_op("torch::Tensor.T").is_property
    assert lookup_op("torch::Tensor.shape").is_property
    assert lookup_op("torch::Tensor.add_").mutates == ("self",)
    assert lookup_op("torch::operator.setitem").side_effects
    assert lookup_op("torch::torch.rand").nondeterministic
    for bad in ("torch::torch.nn", "torch::torch.no_such_fn", "torch::Tensor.no_such_method",
                "torch::math.pi"):
        with pytest.raises(IRError):
            lookup_op(bad)


def test_runtime_registered_callables_are_in_process_only():
    pytest.importorskip("torch")
    from fireclay_ir.dialects import register_callable
    from fireclay_ir.dialects.torch import name_of

    def my_helper(x):
        return x * 2

    op = register_callable("user.my_helper", my_helper)
    assert op.in_process_only and op.side_effects
    assert lookup_op("torch::user.my_helper").target() is my_helper
    assert name_of(my_helper) == "user.my_helper"
    with pytest.raises(IRError):
        lookup_op("torch::user.other_helper")


def test_shipped_schemas_match_installed_torch():
    torch = pytest.importorskip("torch")
    import json
    from importlib import resources

    data = json.loads(resources.files("fireclay_ir.dialects").joinpath("data", "aten_core_v1.json").read_text())
    if data["torch_version"] != torch.__version__.split("+")[0]:
        pytest.skip(f"data generated with torch {data['torch_version']}")
    mismatched = []
    for name, entry in data["ops"].items():
        packet, overload = name.split(".")
        op = getattr(getattr(torch.ops.aten, packet), overload)
        if str(op._schema) != entry["schema"]:
            mismatched.append(name)
        ours = lookup_op(f"aten::{name}")
        theirs = [(a.name, a.kwarg_only, bool(a.alias_info and a.alias_info.is_write)) for a in op._schema.arguments]
        if [(a.name, a.kwarg_only, a.is_write) for a in ours.arguments if a.type != "..."] != theirs:
            mismatched.append(name)
        if len(ours.returns) != len(op._schema.returns):
            mismatched.append(name)
    assert not mismatched
    assert {n for n in data["core"]} == {n for n, e in data["ops"].items() if "core" in e["tags"]}


def test_aten_overload_outside_the_data_comes_from_torch():
    pytest.importorskip("torch")
    op = lookup_op("aten::_cudnn_rnn.default")
    assert "from_torch" in op.tags and op.arguments


def test_every_shipped_schema_parses_into_known_types():
    import re

    known = re.compile(r"^(Tensor|int|SymInt|float|bool|str|complex|Scalar|ScalarType|Layout|Device|"
                       r"MemoryFormat|Generator|AnyEnumType|SymBool|t|Dict\([A-Za-z]+, t\)|\.\.\.)"
                       r"(\?)?(\[\d*\])?(\?)?$")
    for name in shipped_ops():
        op = lookup_op(name)
        for a in op.arguments:
            assert known.match(a.type), (name, a)
            assert a.name.isidentifier() or a.type == "...", (name, a)
        for r in op.returns:
            assert known.match(r.type), (name, r)


def test_generator_script_reproduces_the_shipped_data():
    torch = pytest.importorskip("torch")
    import json
    import pathlib
    from importlib import resources

    script = pathlib.Path(__file__).parents[1] / "scripts" / "gen_aten_schemas.py"
    data = json.loads(resources.files("fireclay_ir.dialects").joinpath("data", "aten_core_v1.json").read_text())
    if not script.exists() or data["torch_version"] != torch.__version__.split("+")[0]:
        pytest.skip("needs the source tree and the torch the data was generated with")
    out = subprocess.run([sys.executable, str(script), "--check"], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
