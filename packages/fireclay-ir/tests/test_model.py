"""The program model: building, use-def links, rewriting, validation."""

import pytest

from fireclay_ir import Graph, InputSpec, IRError, Program, ScalarType, SymExpr, TensorMeta


def _meta(*shape, dtype="float32"):
    return TensorMeta(dtype, tuple(shape))


def test_builder_keeps_use_def_links():
    g = Graph("main")
    x = g.add_input("x", _meta(4, "s0"))
    w = g.add_input("w", _meta(4, "s0"), InputSpec("parameter", "w"))
    y = g.call("aten::mul.Tensor", [x, w], out=_meta(4, "s0"))
    z = g.call("aten::add.Tensor", [y, x], {"alpha": 2}, out=_meta(4, "s0"))
    g.set_outputs([z])
    assert x.users == [y.node, z.node]
    assert y.users == [z.node]
    assert g.input_spec(w).target == "w"
    g.replace_all_uses(y, w)
    assert y.users == [] and z.node.args == (w, x)
    g.erase(y.node)
    assert [n.op for n in g.nodes] == ["aten::add.Tensor"]


def test_multiple_outputs_and_names_are_unique():
    g = Graph()
    x = g.add_input("x", _meta(3))
    a, b = g.call("aten::var_mean.correction", [x], out=[_meta(), _meta()], name="vm")
    c = g.call("aten::sym_size.int", [x, 0], out=ScalarType("int"), name="vm")
    assert len({a.name, b.name, c.name}) == 3
    assert (a.index, b.index) == (0, 1)


@pytest.mark.parametrize("taken", [[], ["y"], ["y", "y_1"]])
def test_copy_node_maps_arguments_and_keeps_names_unique(taken):
    src = Graph("main")
    x = src.add_input("x", _meta(4))
    y, idx = src.call("aten::max.dim", [x, 0], {"keepdim": False}, out=[_meta(), _meta(dtype="int64")], name="y")
    src.set_outputs([y, idx])
    dst = Graph("other")
    names = [dst.add_input(name, _meta(4)) for name in taken]
    x2 = dst.add_input("x2", _meta(4))
    copy = dst.copy_node(y.node, {x: x2}.__getitem__)
    assert copy.op == y.node.op and copy.args == (x2, 0) and copy.kwargs == {"keepdim": False}
    assert copy.meta == y.node.meta and copy.meta is not y.node.meta
    assert [o.type for o in copy.outputs] == [y.type, idx.type] and [o.index for o in copy.outputs] == [0, 1]
    assert x2.users == [copy] and copy.graph is dst and y.node.graph is src
    all_names = [v.name for v in names] + [x2.name] + [o.name for o in copy.outputs]
    assert len(set(all_names)) == len(all_names)
    dst.set_outputs(list(copy.outputs))
    with pytest.raises(IRError, match="already belongs"):
        dst.insert(copy)


def test_erase_refuses_used_values():
    g = Graph()
    x = g.add_input("x", _meta(3))
    y = g.call("aten::neg.default", [x], out=_meta(3))
    g.set_outputs([y])
    with pytest.raises(IRError, match="still used"):
        g.erase(y.node)


def test_inserting_before_places_nodes():
    g = Graph()
    x = g.add_input("x", _meta(3))
    y = g.call("aten::neg.default", [x], out=_meta(3))
    with g.inserting_before(y.node):
        g.call("aten::abs.default", [x], out=_meta(3))
    assert [n.op for n in g.nodes] == ["aten::abs.default", "aten::neg.default"]


@pytest.mark.parametrize(
    "make, message",
    [
        (lambda: TensorMeta("float", (1,)), "unknown dtype"),
        (lambda: TensorMeta("float32", (1.5,)), "int or a symbolic"),
        (lambda: TensorMeta("float32", (2, 3), strides=(1,)), "do not match the rank"),
        (lambda: TensorMeta("float32", (2,), device="CUDA 0"), "malformed device"),
        (lambda: Graph().call("relu", []), "malformed op name"),
        (lambda: InputSpec("parameter"), "needs a target"),
        (lambda: SymExpr(""), "non-empty"),
        (lambda: Program().main, "entry graph"),
    ],
)
def test_malformed_pieces_raise_ir_error(make, message):
    with pytest.raises(IRError, match=message):
        make()


@pytest.mark.parametrize("held", [True, False])
def test_bind_inputs_takes_user_values_and_held_weights(held):
    from fireclay_ir import Weight, bind_inputs

    g = Graph("main")
    x = g.add_input("x", _meta(4))
    w = g.add_input("w", _meta(4), InputSpec("parameter", "fc.w"))
    y = g.add_input("y", _meta(4))
    g.set_outputs([g.call("aten::add.Tensor", [x, w], out=_meta(4)), y])
    program = Program(graphs={"main": g}, weights={"fc.w": Weight(_meta(4), b"data" if held else None)})
    if held:
        assert bind_inputs(program, ["X", "Y"]) == ["X", b"data", "Y"]
    else:
        with pytest.raises(KeyError, match=r"%w is the parameter 'fc.w'.*holds no data.*try again"):
            bind_inputs(program, ["X", "Y"], error=KeyError, hint="try again")
