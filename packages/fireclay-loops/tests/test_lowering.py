"""Lowering: errors for users, symbolic sizes, and the torch-free import."""

import subprocess
import sys

import pytest
from hand import Hand, t

from fireclay_ir import Graph, Program, ScalarType, TensorMeta
from fireclay_loops import LoweringError, lower, schedule


def test_non_aten_ops_are_refused_with_the_users_source_line():
    g = Graph("main")
    x = g.add_input("x", TensorMeta("float32", (4,)))
    y = g.call("torch::torch.relu", (x,), out=TensorMeta("float32", (4,)),
               meta={"source": {"file": "model.py", "line": 12, "text": "y = torch.relu(x)"}})
    g.set_outputs([y])
    with pytest.raises(LoweringError) as err:
        lower(Program.single(g))
    text = str(err.value)
    assert "fireclay-loops lowers aten-dialect programs; got torch::torch.relu" in text
    assert "model.py:12: y = torch.relu(x)" in text


def test_an_extern_with_a_scalar_result_is_refused_clearly():
    h = Hand()
    x = h.input("x", 4)
    v = h.op("_local_scalar_dense.default", h.op("sum.default", x, out=t()), out=ScalarType("float"))
    with pytest.raises(LoweringError, match="returns a non-tensor value"):
        lower(h.program(v))


@pytest.mark.parametrize("read", ["none", "node", "output"])
def test_unread_results_of_fused_attention_get_no_buffer(read):
    """Fused attention on CUDA leaves its log-sum-exp and sequence lengths undefined when no
    backward reads them; a result nothing reads must not be bound (its metadata says a tensor),
    while one a node or the graph's outputs read must be."""
    h = Hand()
    q, k, v = (h.input(name, 2, 4, 16, 8, dtype="bfloat16") for name in "qkv")
    outs = h.op("_scaled_dot_product_cudnn_attention.default", q, k, v, None, read != "none", 0.0, False, False,
                out=[t(2, 4, 16, 8, dtype="bfloat16"), t(2, 4, 16, 1), ScalarType("opaque"), ScalarType("opaque"),
                     ScalarType("int"), ScalarType("int"), t(dtype="int64"), t(dtype="int64"), ScalarType("opaque")])
    extra = [outs[1]] if read == "output" else []
    if read == "node":
        extra = [h.op("exp.default", outs[1], out=t(2, 4, 16, 1))]
    loops = lower(h.program(outs[0], *extra))
    extern = next(n for n in loops.nodes if getattr(n, "op", "") == "aten::_scaled_dot_product_cudnn_attention.default")
    assert extern.result_positions() == ([0] if read == "none" else [0, 1])


@pytest.mark.parametrize("target,extern", [("cuda", True), ("cuda:0", True), ("cpu", False)])
def test_a_copy_between_devices_is_the_librarys_transfer(target, extern):
    """Index tensors made on the CPU for a CUDA tensor are copied to the device in the graph: a
    kernel runs on one device and must not read the other's memory, so that copy is an extern
    call; a copy on one device stays a kernel."""
    from fireclay_ir import Device
    from fireclay_loops.ir import ExternNode

    h = Hand()
    x = h.graph.add_input("idx", TensorMeta("int64", (4,), device="cpu"))
    y = h.op("_to_copy.default", x, device=Device(target), out=TensorMeta("int64", (4,), device=target))
    loops = lower(h.program(y))
    externs = [n for n in loops.nodes if isinstance(n, ExternNode) and n.op == "aten::_to_copy.default"]
    assert bool(externs) is extern


def test_cpu_inputs_of_a_gpu_program_are_never_donated():
    """A backward on the GPU may take a CPU index tensor saved by its forward: its memory must not
    be reused for the program's buffers (kernels would write host memory)."""
    from fireclay_ir import Device

    h = Hand()
    idx = h.graph.add_input("idx", TensorMeta("int64", (4,), device="cpu"))
    x = h.graph.add_input("x", TensorMeta("float32", (4,), device="cuda:0"))
    moved = h.op("_to_copy.default", idx, device=Device("cuda:0"), out=TensorMeta("int64", (4,), device="cuda:0"))
    y = h.op("mul.Tensor", x, moved, out=TensorMeta("float32", (4,), device="cuda:0"))
    loops = lower(h.program(y), donated=[0, 1])
    assert loops.donated == {"in_x"}


def symbolic_program():
    g = Graph("main")
    x = g.add_input("x", TensorMeta("float32", ("s0", "s1")))
    y = g.add_input("y", TensorMeta("float32", ("s1",)))
    n = g.call("aten::sym_size.int", (x, 0), out=ScalarType("int"))
    a = g.call("aten::add.Tensor", (x, y), out=TensorMeta("float32", ("s0", "s1")))
    e = g.call("aten::exp.default", (a,), out=TensorMeta("float32", ("s0", "s1")))
    s = g.call("aten::sum.dim_IntList", (e, [0]), out=TensorMeta("float32", ("s1",)))
    c = g.call("aten::cat.default", ([s, y], 0), out=TensorMeta("float32", ("2*s1",)))
    g.set_outputs([c, n])
    p = Program.single(g)
    p.add_symbol("s0", hint=5)
    p.add_symbol("s1", hint=3)
    return p


def test_symbolic_sizes_flow_through_lowering_and_scheduling():
    from fireclay_ir import dumps, loads
    from fireclay_loops import from_program, to_program

    s = schedule(lower(symbolic_program()))
    assert str(from_program(loads(dumps(to_program(s))))) == str(s)
    text = str(s)
    assert "def kernel0(x0 < s1, r0 < s0):  # reduction" in text
    assert "buf" in text and "float32[2*s1]" in text
    assert str(s.program.outputs[1].value) == "s0"


def test_symbolic_program_runs_for_several_sizes():
    torch = pytest.importorskip("torch")
    from fireclay_loops.reference import run

    s = schedule(lower(symbolic_program()))
    for n, m in ((5, 3), (2, 7)):
        x, y = torch.randn(n, m), torch.randn(m)
        got = run(s, x, y)
        torch.testing.assert_close(got[0], torch.cat([(x + y).exp().sum(0), y]))
        assert got[1] == n


def test_symbolic_buffers_are_reused_by_symbolic_size():
    g = Graph("main")
    x = g.add_input("x", TensorMeta("float32", ("s0", 8)))
    v = x
    for op in ("exp", "sin", "cos", "neg"):
        v = g.call(f"aten::{op}.default", (v,), out=TensorMeta("float32", ("s0", 8)))
    g.set_outputs([v])
    p = Program.single(g)
    p.add_symbol("s0", hint=4)
    s = schedule(lower(p), fusion=False)
    assert [(b, prev) for b, prev, _ in s.plan.reuses] == [("buf2", "buf0"), ("buf3", "buf1")]
    assert str(s.plan.allocations["mem0"].nbytes) == "32*s0"


def test_importing_the_package_does_not_import_torch():
    code = "import sys, fireclay_loops; assert 'torch' not in sys.modules, 'torch was imported'"
    subprocess.run([sys.executable, "-c", code], check=True)


@pytest.mark.parametrize("exponent,dtype,ops", [
    (3.0, "float32", ["mul", "mul"]),         # GELU's tanh form: v * (v*v), eager's own bits
    (2, "float32", ["mul"]),
    (4, "int64", ["mul", "mul"]),             # squaring: (v*v) * (v*v)
    (-2.0, "float32", ["mul", "reciprocal"]),
    (-0.5, "float32", ["rsqrt"]),
    (1.7, "float32", ["pow"]),                # not an integer: the library's pow
    (-2, "int64", ["pow"]),                   # eager refuses it; the op says so at run time
])
def test_small_integer_powers_are_multiplications(exponent, dtype, ops):
    """A vectorised pow() of negative bases runs one to two orders of magnitude slower than the
    multiplications: integer exponents up to MAX_MULTIPLIED_EXPONENT lower to them."""
    h = Hand()
    x = h.input("x", 4, 8, dtype=dtype)
    y = h.op("pow.Tensor_Scalar", x, exponent, out=t(4, 8, dtype=dtype))
    node = lower(h.program(y)).nodes[1]
    arithmetic = [op.name for op in node.body.ops if op.name not in ("load", "store", "constant", "to_dtype")]
    assert arithmetic == ops


def _cpu_scalar_times_device(h, cuda):
    x = h.graph.add_input("x", TensorMeta("float32", (4, 8), device=cuda))
    s = h.graph.add_input("s", TensorMeta("float32", (), device="cpu"))
    y = h.op("mul.Tensor", x, s, out=TensorMeta("float32", (4, 8), device=cuda))
    return h.op("relu.default", y, out=TensorMeta("float32", (4, 8), device=cuda))


def _cpu_arithmetic_then_device(h, cuda):
    x = h.graph.add_input("x", TensorMeta("float32", (4, 8), device=cuda))
    n = h.graph.add_input("n", TensorMeta("int64", (), device="cpu"))
    m = h.op("add.Tensor", n, 1, out=TensorMeta("int64", (), device="cpu"))
    d = h.op("div.Tensor_mode", m, 2, rounding_mode="trunc", out=TensorMeta("int64", (), device="cpu"))
    y = h.op("sub.Tensor", x, d, out=TensorMeta("float32", (4, 8), device=cuda))
    return h.op("exp.default", y, out=TensorMeta("float32", (4, 8), device=cuda))


def _device_tensors_from_cpu_inputs(h, cuda):
    from fireclay_ir import Device

    n = h.graph.add_input("n", TensorMeta("int64", (), device="cpu"))
    a = h.op("arange.start_step", 0, 8, 1, dtype=None, device=Device(cuda), out=TensorMeta("int64", (8,), device=cuda))
    b = h.op("mul.Tensor", a, n, out=TensorMeta("int64", (8,), device=cuda))
    return h.op("add.Tensor", b, 3, out=TensorMeta("int64", (8,), device=cuda))


@pytest.mark.parametrize("cuda", ["cuda", "cuda:0"])
@pytest.mark.parametrize("build", [_cpu_scalar_times_device, _cpu_arithmetic_then_device,
                                   _device_tensors_from_cpu_inputs])
def test_kernels_of_a_gpu_graph_never_touch_cpu_tensors(build, cuda):
    """Eager takes a CPU 0-d tensor beside CUDA tensors as a number, and a graph cut at a break
    may compute on CPU scalars or take only CPU tensors and make CUDA ones. A GPU kernel handed
    host memory reads garbage or faults (an illegal memory access poisons the CUDA context, so
    no fallback can follow): every node that touches a CPU tensor is a library call, and every
    kernel's buffers are on the GPU."""
    from fireclay_loops import accelerator
    from fireclay_loops.ir import ComputeNode

    h = Hand()
    program = h.program(build(h, cuda))
    assert accelerator(program) == "cuda"
    scheduled = schedule(lower(program))
    loops = scheduled.program
    for node in loops.nodes:
        if isinstance(node, ComputeNode):
            for b in node.read_buffers() + node.write_buffers():
                assert loops.buffers[b].device.startswith("cuda"), (node.name, b, loops.buffers[b].device)
    assert any(isinstance(n, ComputeNode) for n in loops.nodes)  # the device part still fuses into kernels


def test_a_cpu_graph_has_no_accelerator():
    from fireclay_loops import accelerator

    h = Hand()
    x = h.input("x", 4)
    assert accelerator(h.program(h.op("relu.default", x, out=t(4)))) is None
