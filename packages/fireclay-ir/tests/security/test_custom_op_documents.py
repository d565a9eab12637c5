"""Custom operators (``aten::<namespace>::<op>.<overload>``) in documents: a document may name
only operators this process registered with ``register_custom_op``; any other is refused at
load by name, and a name never makes torch look an operator up by itself (docs/security.md)."""

from __future__ import annotations

import pytest

from fireclay_ir import FormatError, Graph, IRError, Program, TensorMeta, dumps, interpret, loads, lookup_op
from fireclay_ir.dialects import custom_op_name, is_custom_op, register_custom_op, split_op_name


def f32(*shape: int) -> TensorMeta:
    return TensorMeta("float32", tuple(shape))


def one_call(op: str) -> Program:
    g = Graph("main")
    x = g.add_input("x", f32(2))
    y = g.call(op, [x], out=f32(2))
    g.set_outputs([y])
    return Program.single(g)


def double(x):
    return x * 2


@pytest.mark.parametrize("op, why", [
    ("aten::nolib::nothing.default", "not registered in this process"),
    ("aten::nolib::nothing", "malformed custom op name"),
])
def test_unregistered_custom_ops_are_refused_at_load(op, why):
    text = dumps(one_call(op))
    with pytest.raises(FormatError, match=why):
        loads(text)
    with pytest.raises(IRError, match=why):
        lookup_op(op)


def test_a_registered_custom_op_loads_and_runs_in_this_process():
    torch = pytest.importorskip("torch")
    name = custom_op_name("fireclay_ir_test", "double", "default")
    register_custom_op(name, "fireclay_ir_test::double(Tensor x) -> Tensor", lambda: double)
    program = loads(dumps(one_call(name)))
    x = torch.randn(2)
    (out,) = interpret(program, x)
    torch.testing.assert_close(out, x * 2)
    op = lookup_op(name)
    assert op.in_process_only and op.is_pure and "custom" in op.tags
    assert [a.name for a in op.arguments] == ["x"]


@pytest.mark.parametrize("name, schema, why", [
    ("aten::aten::add.Tensor", "aten::add.Tensor(Tensor self, Tensor other) -> Tensor", "torch's own"),
    ("aten::prims::add.default", "prims::add(Tensor self, Tensor other) -> Tensor", "torch's own"),
    ("aten::add.Tensor", "aten::add.Tensor(Tensor self, Tensor other) -> Tensor", "not a custom operator"),
    ("aten::lib::op", "lib::op(Tensor x) -> Tensor", "malformed"),
    ("aten::lib::st.default", "lib::st(Storage s, Tensor x) -> Tensor", "Storage"),
])
def test_registering_refuses_what_is_not_a_custom_tensor_op(name, schema, why):
    with pytest.raises(IRError, match=why):
        register_custom_op(name, schema, lambda: double)


def test_a_mutating_custom_op_declares_its_write():
    name = custom_op_name("fireclay_ir_test", "acc", "default")
    op = register_custom_op(name, "fireclay_ir_test::acc(Tensor(a!) out, Tensor x) -> ()", lambda: None)
    assert op.mutates == ("out",) and op.side_effects and not op.is_pure


@pytest.mark.parametrize("op, parts, custom", [
    ("aten::add.Tensor", ("aten", "add", "Tensor"), False),
    ("aten::lib::scale.default", ("lib", "scale", "default"), True),
    ("prims::convert_element_type.default", ("prims", "convert_element_type", "default"), False),
    ("torch::torch.add", ("torch", "torch", "add"), False),
])
def test_split_op_name(op, parts, custom):
    assert split_op_name(op) == parts
    assert is_custom_op(op) is custom
