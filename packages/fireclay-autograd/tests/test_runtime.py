"""The runtime wrapper and the public API: gradients flow only where eager sends them, double
backward fails clearly, any backend can run the halves, errors name the problem."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from fx_programs import program_from
from helpers import check_against_eager

from fireclay_autograd import (
    CORE_OPS,
    DoubleBackwardError,
    aot_backend,
    aot_graphs,
    compile_program,
    interpreter_backend,
    trace_to_aten,
)
from fireclay_ir import Program


def test_non_differentiable_outputs_do_not_require_grad():
    def fn(x, y):
        return x * 2, x.argmax(1), y + 1, (x > 0)

    x = torch.randn(3, 4, requires_grad=True)
    y = torch.randn(3, 4)
    outs = compile_program(program_from(fn, [x, y]), [x, y])(x, y)
    assert [o.requires_grad for o in outs] == [True, False, False, False]
    check_against_eager(fn, [x, y])


@pytest.mark.parametrize("fn", [
    lambda a: a.argmax(1),
    lambda a: (a > 0, a.int()),
    lambda a: (a.detach() * 2, a * 3),
], ids=["argmax_only", "bool_and_int_only", "detached_and_differentiable"])
def test_outputs_without_gradient_when_inputs_require_it(fn):
    check_against_eager(fn, [torch.randn(3, 4, requires_grad=True)])


def test_unused_input_gets_no_gradient():
    def fn(x, y):
        return (x * 3).sum()

    x = torch.randn(3, requires_grad=True)
    y = torch.randn(3, requires_grad=True)
    compile_program(program_from(fn, [x, y]), [x, y])(x, y)[0].backward()
    torch.testing.assert_close(x.grad, torch.full((3,), 3.0))
    assert y.grad is None


def test_only_some_outputs_used_in_loss():
    def fn(x):
        return x.sin(), x.cos()

    x = torch.randn(5, requires_grad=True)
    a, _ = compile_program(program_from(fn, [x]), [x])(x)
    a.sum().backward()  # the second output gets no gradient at all
    torch.testing.assert_close(x.grad, x.detach().cos())


def test_double_backward_raises_a_clear_error():
    def fn(x):
        return (x ** 3).sum()

    x = torch.randn(4, requires_grad=True)
    out = compile_program(program_from(fn, [x]), [x])(x)[0]
    with pytest.raises(DoubleBackwardError, match="double backward.*not supported"):
        torch.autograd.grad(out, x, create_graph=True)


def test_backends_receive_aten_programs_and_examples():
    seen: list[tuple[str, int, int]] = []

    def recording_backend(program: Program, examples):
        assert all(n.dialect == "aten" for n in program.main.nodes)
        assert len(examples) == len(program.main.inputs)
        for v, e in zip(program.main.inputs, examples):
            assert list(e.shape) == list(v.meta.shape)
        seen.append((program.entry, len(program.main.inputs), len(program.main.outputs)))
        return interpreter_backend(program, examples)

    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.GELU(), torch.nn.Linear(8, 2))
    x = torch.randn(3, 4)
    backend = aot_backend(recording_backend, recording_backend)
    compiled = backend(program_from(model, [x]), [x])
    out = compiled(x)[0]
    out.sum().backward()
    assert [s[0] for s in seen] == ["forward", "backward"]
    torch.testing.assert_close(out, model(x))


def test_graphs_use_the_core_op_set():
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.LayerNorm(8), torch.nn.SiLU(), torch.nn.Linear(8, 3))
    x = torch.randn(5, 4)
    graphs = aot_graphs(program_from(model, [x]), [x])
    for program in (graphs.forward, graphs.backward, trace_to_aten(program_from(model, [x]), [x])):
        for node in program.main.nodes:
            assert node.op in CORE_OPS, node.op


def test_source_locations_are_carried_to_aten_nodes():
    def fn(x):
        return F.gelu(x) * 2

    x = torch.randn(3, requires_grad=True)
    graphs = aot_graphs(program_from(fn, [x]), [x])
    forward_nodes = graphs.forward.main.nodes
    assert forward_nodes and all("gelu" in n.meta["source"]["text"] or "mul" in n.meta["source"]["text"]
                                 for n in forward_nodes)
    backward_nodes = graphs.backward.main.nodes
    assert {n.meta.get("autograd.phase") for n in backward_nodes} <= {"forward", "backward"}
    # Backward ops are attributed to the forward line whose derivative they compute.
    texts = {n.meta["source"]["text"] for n in backward_nodes if "source" in n.meta}
    assert any("gelu" in t for t in texts) and any("mul" in t for t in texts)


def test_shape_change_is_reported():
    def fn(x):
        return x + 1

    x = torch.randn(3, 4)
    compiled = compile_program(program_from(fn, [x]), [x])
    with pytest.raises(TypeError, match=r"input %\w+ is a torch.float32 tensor of shape \[5, 4\].*recompile"):
        compiled(torch.randn(5, 4))


@pytest.mark.parametrize("make,described", [
    (lambda: torch.randn(5, 4), r"a torch.float32 tensor of shape \[5, 4\] on cpu"),
    (lambda: torch.randn(3, 4, dtype=torch.float64), r"a torch.float64 tensor of shape \[3, 4\] on cpu"),
    (lambda: torch.randn(3, 4, device="meta"), r"a torch.float32 tensor of shape \[3, 4\] on meta"),
    (lambda: torch.randn(4), r"a torch.float32 tensor of shape \[4\] on cpu"),
    (lambda: 2.5, r"a float"),
], ids=["shape", "dtype", "device", "rank", "not_a_tensor"])
def test_every_kind_of_input_change_is_reported(make, described):
    def fn(x, y):
        return x * y

    x, y = torch.randn(3, 4), torch.randn(4)
    compiled = compile_program(program_from(fn, [x, y]), [x, y])
    with pytest.raises(TypeError, match=rf"input %\w+ is {described} but the program was compiled for a "
                                        r"torch.float32 tensor of shape \[3, 4\] on cpu; recompile"):
        compiled(make(), y)
    # what the program was compiled for still runs, in any layout and as a parameter
    for a in (torch.randn(3, 4), torch.randn(4, 3).t(), torch.nn.Parameter(torch.randn(3, 4))):
        (got,) = compiled(a, y)
        torch.testing.assert_close(got, fn(a, y))


def test_wrong_number_of_inputs_is_reported():
    def fn(x, y):
        return x + y

    x = torch.randn(3)
    compiled = compile_program(program_from(fn, [x, x]), [x, x])
    with pytest.raises(TypeError, match="takes 2 inputs, got 1"):
        compiled(x)


def test_untraceable_data_dependence_names_the_op():
    from fireclay_ir import Graph, TensorMeta

    g = Graph("main")
    x = g.add_input("x", TensorMeta("float32", (3,)))
    s = g.call("torch::Tensor.sum", [x], out=TensorMeta("float32", ()),
               meta={"source": {"file": "model.py", "line": 7, "text": "total = x.sum().item()"}})
    item = g.call("torch::Tensor.item", [s], out=TensorMeta("float32", ()),
                  meta={"source": {"file": "model.py", "line": 7, "text": "total = x.sum().item()"}})
    g.set_outputs([item])
    with pytest.raises(Exception, match=r"(?s)data-dependent.*model.py:7"):
        trace_to_aten(Program.single(g), [torch.randn(3)])


def test_parameters_come_from_program_weights():
    lin = torch.nn.Linear(3, 2)
    x = torch.randn(4, 3)
    program = program_from(lin, [x])
    assert {s.kind for s in program.main.input_specs} == {"user", "parameter"}
    compiled = compile_program(program, [x])
    torch.testing.assert_close(compiled(x)[0], lin(x))
    with torch.no_grad():
        lin.weight.mul_(2)  # the compiled program sees live parameters
    torch.testing.assert_close(compiled(x)[0], lin(x))


def test_hand_built_torch_program():
    from fireclay_ir import Graph, TensorMeta

    g = Graph("main")
    x = g.add_input("x", TensorMeta("float32", (2, 3), requires_grad=True))
    y = g.call("torch::torch.nn.functional.gelu", [x], out=TensorMeta("float32", (2, 3)))
    t = g.call("torch::Tensor.T", [y], out=TensorMeta("float32", (3, 2), strides=(1, 3)))
    z = g.call("torch::operator.mul", [t, 2.0], out=TensorMeta("float32", (3, 2)))
    g.set_outputs([z])
    xin = torch.randn(2, 3, requires_grad=True)
    out = compile_program(Program.single(g), [xin])(xin)[0]
    torch.testing.assert_close(out, F.gelu(xin).T * 2)
    out.sum().backward()
    expected = torch.autograd.grad((F.gelu(xin).T * 2).sum(), xin)[0]
    torch.testing.assert_close(xin.grad, expected)


MODELS = {
    "mlp": (lambda: torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.GELU(), torch.nn.LayerNorm(8)),
            lambda: torch.randn(3, 4)),
    "conv_bn": (lambda: torch.nn.Sequential(torch.nn.Conv2d(2, 4, 3), __import__("fx_programs").BatchNorm2d(4),
                                            torch.nn.ReLU()), lambda: torch.randn(2, 2, 6, 6)),
    "constant": (lambda: (lambda x: x * torch.tensor([1.0, 2.0, 3.0])), lambda: torch.randn(2, 3)),
}


_VERIFIER_GAP = pytest.mark.xfail(
    strict=True, reason="convolution_backward leaves the input gradient undefined (output_mask); "
    "fireclay-ir's aten verifier does not yet accept a None result for a plain Tensor return")


@pytest.mark.parametrize("name", [pytest.param("conv_bn", marks=_VERIFIER_GAP), "constant", "mlp"])
def test_programs_verify_print_and_roundtrip(name):
    from fireclay_ir import dumps, format_program, loads, verify

    model, make = MODELS[name][0](), MODELS[name][1]
    x = make()
    programs = [trace_to_aten(program_from(model, [x]), [x])]
    if isinstance(model, torch.nn.Module):
        graphs = aot_graphs(program_from(model, [x]), [x])
        programs += [graphs.forward, graphs.backward]
    for program in programs:
        verify(program)
        text = format_program(program)
        assert "aten." in text and f"graph {program.entry}" in text
        again = loads(dumps(program))
        assert format_program(again) == text


def test_example_tensors_have_the_inputs_types_and_zero_integers():
    from fireclay_autograd.convert import example_tensors, tensor_meta
    from fireclay_ir import Graph

    reals = [torch.randn(4, 6).t(), torch.randint(0, 9, (5,)), torch.rand(3) > 0.5,
             torch.randn(8, dtype=torch.float64)[2:]]
    graph = Graph("g")
    values = [graph.add_input(f"x{i}", tensor_meta(t)) for i, t in enumerate(reals)]
    examples = example_tensors(values)
    for real, made in zip(reals, examples):
        assert (made.shape, made.stride(), made.storage_offset(), made.dtype, made.device) == \
            (real.shape, real.stride(), real.storage_offset(), real.dtype, real.device)
    assert not examples[1].any() and not examples[2].any()


@pytest.mark.parametrize("op,index,value,expected", [
    ("_scaled_dot_product_cudnn_attention.default", 4, 128, True),   # max_q: a sequence length
    ("_scaled_dot_product_flash_attention.default", 5, 64, True),    # max_k
    ("_local_scalar_dense.default", 0, 3, False),                    # .item(): data
    ("_scaled_dot_product_cudnn_attention.default", 4, True, False), # not an int
    ("_scaled_dot_product_cudnn_attention.default", 0, 3, False),    # the schema says Tensor
])
def test_int_results_derived_from_metadata_are_sizes_not_data(op, index, value, expected):
    """A meta kernel cannot read data: an int it returns where the schema returns an int is a
    size (fused attention's max_q/max_k), unless the op is tagged data-dependent."""
    from fireclay_autograd.tracer import _size_result

    packet, _, overload = op.partition(".")
    assert _size_result(getattr(getattr(torch.ops.aten, packet), overload), index, value) is expected


def test_the_fallback_engine_reshapes_a_view_its_input_layout_cannot_take():
    """The default backend runs a functional aten graph; an input laid out otherwise than at
    tracing (a saved tensor as generated code returned it) still gives the graph's values where
    a traced ``view`` would need the old layout."""
    from fx_programs import program_from

    from fireclay_autograd import aot_graphs
    from fireclay_autograd.executor import run_graph, run_program

    def fn(x):
        return (x.sin() * 2).view(-1)

    x = torch.randn(4, 6)
    graphs = aot_graphs(program_from(fn, [x.clone()]), [x.clone()])
    assert graphs.forward.main.find("aten::view.default")
    transposed = torch.randn(6, 4).t()  # the same sizes, other strides: sin() keeps them
    (got,) = run_program(graphs.forward, transposed)[:1]
    torch.testing.assert_close(got, fn(transposed.contiguous()))
    with pytest.raises(RuntimeError, match="view size is not compatible"):
        run_graph(graphs.forward.main, [transposed])
