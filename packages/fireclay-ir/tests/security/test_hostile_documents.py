"""Hostile documents: each one reproduces a way a ``.fcir.json`` file could reach outside its
own tensors, and must be refused at load (or stopped by the run's limits) instead.

See docs/security.md for what a document may and may not do.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import threading

import pytest

import fireclay_ir
from fireclay_ir import (
    FormatError,
    Graph,
    GraphRef,
    InputSpec,
    IRError,
    Program,
    ScalarType,
    SymExpr,
    TensorMeta,
    Weight,
    dumps,
    interpret,
    load,
    loads,
    lookup_op,
    save,
)

OPAQUE = ScalarType("opaque")


def f32(*shape: int) -> TensorMeta:
    return TensorMeta("float32", tuple(shape))


def exploit_program(marker: str) -> Program:
    """``x.__getattribute__('__repr__').__func__.__globals__['__builtins__']['exec']`` called
    through ``torch.cond`` with a Python bool: the chain issue 23 reported."""
    g = Graph("main")
    x = g.add_input("x", f32(2))
    get = "torch::Tensor.__getattribute__"
    method = g.call(get, [x, "__repr__"], out=OPAQUE)
    func = g.call(get, [method, "__func__"], out=OPAQUE)
    globs = g.call(get, [func, "__globals__"], out=OPAQUE)
    builtins = g.call("torch::operator.getitem", [globs, "__builtins__"], out=OPAQUE)
    exec_ = g.call("torch::operator.getitem", [builtins, "exec"], out=OPAQUE)
    g.call("torch::torch.cond", [True, exec_, exec_, [f"open({marker!r}, 'w').close()"]], out=[])
    g.set_outputs([x])
    return Program.single(g)


def single_op_program(op: str, args: list, out=None) -> Program:
    g = Graph("main")
    x = g.add_input("x", f32(2))
    g.call(op, [x if a == "x" else a for a in args], out=f32(2) if out is None else out)
    g.set_outputs([x])
    return Program.single(g)


# ------------------------------------------------------------------ finding 1: the torch dialect


def test_the_reported_exploit_does_not_load_and_does_not_run(tmp_path):
    torch = pytest.importorskip("torch")
    marker = str(tmp_path / "pwned")
    text = dumps(exploit_program(marker))
    with pytest.raises(FormatError, match=r"nodes\[0\]\.op: unknown op 'torch::Tensor.__getattribute__'"):
        loads(text)
    # Even a caller that skips the load checks cannot run it: the interpreter resolves the same names.
    program = loads(text, check_ops=False, verify=False)
    with pytest.raises(IRError, match="dunder"):
        interpret(program, torch.ones(2))
    assert not os.path.exists(marker)


@pytest.mark.parametrize("op, why", [
    ("torch::Tensor.__getattribute__", "dunder"),
    ("torch::Tensor.__setattr__", "dunder"),
    ("torch::Tensor.__class__", "dunder"),
    ("torch::Tensor.__init_subclass__", "dunder"),
    ("torch::torch.cond", "not allowed"),
    ("torch::torch.while_loop", "not allowed"),
    ("torch::Tensor.apply_", "not allowed"),
    ("torch::Tensor.map_", "not allowed"),
    ("torch::Tensor.type", "not allowed"),            # imports a dotted name given as a string
    ("torch::Tensor.data_ptr", "not allowed"),
    ("torch::Tensor.untyped_storage", "not allowed"),
    ("torch::Tensor.grad_fn", "attributes a graph may read"),
    ("torch::torch.Tensor", "class"),
    ("torch::torch.Generator", "class"),
    ("torch::torch.typename", "defined in torch"),
    ("torch::torch.set_flush_denormal", "not one of torch's tensor ops"),
    ("torch::torch.import_ir_module", "not one of torch's tensor ops"),
    ("torch::torch.nn.functional.handle_torch_function", "torch.overrides"),
    ("torch::torch.sparse_coo_tensor", "without checking its indices"),
    ("torch::math.factorial", "elementary"),
    ("torch::operator.concat", "arithmetic"),
])
def test_names_outside_the_torch_allow_list_do_not_load(op, why):
    pytest.importorskip("torch")
    with pytest.raises(FormatError, match=why):
        loads(dumps(single_op_program(op, ["x"])))


@pytest.mark.parametrize("op", [
    "torch::torch.add", "torch::torch.nn.functional.gelu", "torch::torch.nn.functional.max_pool2d",
    "torch::torch.split", "torch::torch.einsum", "torch::torch.linalg.vector_norm", "torch::torch.fft.rfft",
    "torch::torch.special.erf", "torch::Tensor.view", "torch::Tensor.split", "torch::Tensor.__rsub__",
    "torch::Tensor.__getitem__", "torch::Tensor.T", "torch::Tensor.shape", "torch::operator.getitem",
    "torch::operator.setitem", "torch::math.sqrt", "torch::torch.rand",
])
def test_tensor_functions_still_resolve(op):
    pytest.importorskip("torch")
    lookup_op(op)


def test_operator_ops_refuse_unbounded_python_values():
    result = _run_python("""
        from fireclay_ir import lookup_op
        pow_, mul, lshift = (lookup_op(f"torch::operator.{n}").target() for n in ("pow", "mul", "lshift"))
        assert pow_(3, 4) == 81 and mul([1], 3) == [1, 1, 1] and lshift(1, 10) == 1024
        for call in (lambda: pow_(9, 10**12), lambda: mul("a", 2**62), lambda: lshift(1, 2**62)):
            try:
                call()
            except OverflowError as e:
                print("refused:", e)
    """, timeout=60)
    assert result.stdout.count("refused:") == 3 and "the limit is" in result.stdout, result.stderr[-2000:]


# ------------------------------------------------------------------ finding 2: the aten dialect


def test_from_file_does_not_load():
    pytest.importorskip("torch")
    program = single_op_program("aten::from_file.default", ["/etc/passwd", True, 16], out=TensorMeta("uint8", (16,)))
    with pytest.raises(FormatError, match="refused in a program: it reads or writes files"):
        loads(dumps(program))


@pytest.mark.parametrize("op, why", [
    ("aten::from_file.default", "files"),
    ("aten::save.default", "files"),
    ("aten::set_.source_Storage", "storage"),
    ("aten::set_.source_Tensor", "storage"),
    ("aten::set_.source_Tensor_storage_offset", "storage"),
    ("aten::_reshape_alias.default", "storage"),          # no bounds check: reads past the storage
    ("aten::_pin_memory.default", "storage"),
    ("aten::record_stream.default", "storage"),
    ("aten::_sparse_coo_tensor_with_dims_and_tensors.default", "indices"),
    ("aten::sparse_coo_tensor.indices_size", "indices"),
    ("aten::manual_seed.default", "process-wide state"),
    ("aten::set_grad_enabled.default", "process-wide state"),
    ("aten::_cufft_clear_plan_cache.default", "process-wide state"),
    ("aten::backward.default", "autograd"),
    ("aten::wait.default", "autograd, futures"),
    ("aten::append.t", "not a tensor op"),
    ("aten::format.default", "not a tensor op"),
])
def test_aten_ops_that_reach_outside_tensors_are_refused(op, why):
    pytest.importorskip("torch")
    with pytest.raises(IRError, match=why):
        lookup_op(op)


def test_every_shipped_aten_schema_still_resolves():
    from fireclay_ir.dialects import shipped_ops

    for name in shipped_ops():
        lookup_op(name)


# ------------------------------------------------------------------ finding 7: limits


def _run_python(code: str, timeout: float) -> subprocess.CompletedProcess:
    """Run ``code`` in a fresh interpreter, so that a hang is a failed test, not a stuck suite."""
    try:
        return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True,
                              timeout=timeout, env=os.environ)
    except subprocess.TimeoutExpired:
        pytest.fail(f"still running after {timeout} s")


def _program_with_weight() -> Program:
    g = Graph("main")
    w = g.add_input("w", f32(2), InputSpec("parameter", "w"))
    g.set_outputs([w])
    return Program.single(g, weights={"w": Weight(f32(2))})


def _load_in_thread(path: str) -> tuple[threading.Thread, list]:
    outcome: list = []

    def target():
        try:
            outcome.append(load(path, weights="bytes"))
        except BaseException as exc:  # the outcome is checked by the test
            outcome.append(exc)

    thread = threading.Thread(target=target, daemon=True)
    thread.start()
    thread.join(timeout=10)
    return thread, outcome


def _unblock(fifo: str) -> None:
    # Opening the FIFO's write end (without blocking) and closing it ends a reader stuck on it.
    try:
        os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))
    except OSError:
        pass


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="needs FIFOs")
@pytest.mark.parametrize("which", ["weights", "document"])
def test_a_fifo_is_refused_not_waited_on(tmp_path, which):
    path = str(tmp_path / "p.fcir.json")
    save(_program_with_weight(), path)
    fifo = str(tmp_path / ("p.fcir.safetensors" if which == "weights" else "q.fcir.json"))
    if which == "weights":
        assert not os.path.exists(fifo)  # the weight holds no data: no weights file was written
    else:
        path = fifo
    os.mkfifo(fifo)
    thread, outcome = _load_in_thread(path)
    if thread.is_alive():
        _unblock(fifo)
        thread.join(timeout=10)
        pytest.fail("load() blocked on a FIFO")
    assert isinstance(outcome[0], FormatError) and "not a regular file" in str(outcome[0])


def _mutated_document(program: Program, edit) -> str:
    doc = json.loads(dumps(program))
    edit(doc)
    return json.dumps(doc)


def test_a_float_literal_out_of_range_is_refused():
    text = json.dumps(json.loads(dumps(single_op_program("torch::torch.add", ["x", 1.5]))), separators=(",", ":"))
    assert '{"float":1.5}' in text
    with pytest.raises(FormatError, match=r"args\[1\]\.float: the number .* is not a finite float"):
        loads(text.replace('{"float":1.5}', '{"float":1e400}'))
    assert loads(text.replace('{"float":1.5}', '{"float":"inf"}')).main.nodes[0].args[1] == float("inf")


@pytest.mark.parametrize("field, where", [("shape", r"shape\[0\]"), ("strides", r"strides\[0\]"),
                                          ("storage_offset", "storage_offset")])
def test_negative_sizes_are_refused(field, where):
    def edit(doc):
        tensor = doc["graphs"]["main"]["inputs"][0]["type"]["tensor"]
        tensor[field] = -5 if field == "storage_offset" else [-5]

    with pytest.raises(FormatError, match=rf"inputs\[0\]\.type\.tensor\.{where}: .* must not be negative, got -5"):
        loads(_mutated_document(single_op_program("torch::torch.add", ["x", 1.5]), edit))


def test_a_huge_symbolic_power_fails_fast():
    pytest.importorskip("torch")  # the interpreter runs tensors
    result = _run_python("""
        import torch
        from fireclay_ir import Graph, IRError, Program, SymExpr, TensorMeta, interpret
        g = Graph("main")
        x = g.add_input("x", TensorMeta("float32", (2,)))
        g.set_outputs([g.call("torch::operator.add", [x, SymExpr("9**9**9**9")], out=TensorMeta("float32", (2,)))])
        try:
            interpret(Program.single(g), torch.ones(2))
        except IRError as e:
            print("refused:", e)
    """, timeout=60)
    assert "refused:" in result.stdout and "too large" in result.stdout, result.stderr[-2000:]


def _endless_loop() -> Program:
    p = Program()
    cond = p.add_graph(Graph("loop_cond"))
    cond.add_input("x", f32(2))
    cond.set_outputs([True])
    body = p.add_graph(Graph("loop_body"))
    body.set_outputs([body.add_input("x", f32(2))])
    main = p.add_graph(Graph("main"))
    x = main.add_input("x", f32(2))
    main.set_outputs(main.call("hop::while_loop", [GraphRef("loop_cond"), GraphRef("loop_body"), [x], []],
                               out=[f32(2)]))
    return p


def test_an_endless_loop_stops_at_the_step_limit():
    torch = pytest.importorskip("torch")
    program = loads(dumps(_endless_loop()))
    with pytest.raises(fireclay_ir.RunLimitError, match="more than 1000 steps"):
        interpret(program, torch.ones(2), limits=fireclay_ir.RunLimits(max_steps=1000))


def test_an_allocation_beyond_the_byte_limit_is_refused_before_it_is_made():
    torch = pytest.importorskip("torch")
    # The node declares a small result, but asks torch for 2**33 floats (32 GiB).
    program = loads(dumps(single_op_program("torch::torch.ones", [[2**33]])))
    with pytest.raises(fireclay_ir.RunLimitError, match="would allocate 34359738368 bytes"):
        interpret(program, torch.ones(2), limits=fireclay_ir.RunLimits(max_bytes=2**30))


def test_a_declared_result_beyond_the_byte_limit_is_refused():
    torch = pytest.importorskip("torch")
    g = Graph("main")
    x = g.add_input("x", f32(2))
    g.set_outputs([g.call("torch::torch.zeros", [[SymExpr("2**33")]], out=TensorMeta("float32", ("2**33",)))])
    with pytest.raises(fireclay_ir.RunLimitError, match="needs 34359738368 bytes"):
        interpret(loads(dumps(Program.single(g))), torch.ones(2), limits=fireclay_ir.RunLimits(max_bytes=2**30))
    del x


def test_inputs_beyond_the_byte_limit_are_refused():
    torch = pytest.importorskip("torch")
    program = loads(dumps(single_op_program("torch::torch.add", ["x", 1.5])))
    with pytest.raises(fireclay_ir.RunLimitError, match="input %x holds 8 bytes"):
        interpret(program, torch.ones(2), limits=fireclay_ir.RunLimits(max_bytes=4))


def test_limited_runs_match_unlimited_ones_and_restore_grad_mode():
    torch = pytest.importorskip("torch")
    g = Graph("main")
    x = g.add_input("x", f32(3, 4))
    y = g.call("torch::torch.nn.functional.gelu", [x], out=f32(3, 4))
    z = g.call("torch::Tensor.sum", [y], {"dim": 1}, out=f32(3))
    g.set_outputs([g.call("torch::operator.mul", [z, 2.0], out=f32(3))])
    program = loads(dumps(Program.single(g)))
    value = torch.randn(3, 4)
    expected = interpret(program, value)
    assert torch.equal(interpret(program, value, limits=fireclay_ir.RunLimits())[0], expected[0])
    assert torch.equal(expected[0], torch.nn.functional.gelu(value).sum(dim=1) * 2.0)
    assert torch.is_grad_enabled()
