"""The public entry points: compile_program on each kind of program, the fw/bw backend, dump,
and errors for users."""

from __future__ import annotations

import os

import pytest
import torch
from aten_builder import AtenBuilder

import fireclay_cpp
from fireclay_loops import lower, schedule


def _mlp():
    gen = torch.Generator().manual_seed(0)
    xs = [torch.randn(6, 10, generator=gen), torch.randn(10, 4, generator=gen), torch.randn(4, generator=gen)]
    b = AtenBuilder()
    x, w, bias = (b.input(t, n) for t, n in zip(xs, "xwb"))
    h = b.call("addmm.default", bias, x, w)
    y = b.call("gelu.default", h)
    s = b.call("_softmax.default", y, 1, False)
    return b.output(s, h), b, xs


@pytest.mark.parametrize("stage", ["aten", "loops", "scheduled"])
def test_compile_program_takes_each_stage(stage):
    program, b, xs = _mlp()
    arg = {"aten": program, "loops": lower(program), "scheduled": schedule(lower(program))}[stage]
    compiled = fireclay_cpp.compile_program(arg, xs)
    for _ in range(2):  # fresh inputs each call
        fresh = [torch.randn_like(t) for t in xs]
        for g, w in zip(compiled(*fresh), b.eager(*fresh)):
            torch.testing.assert_close(g, w, atol=1e-5, rtol=1e-5)


def test_backend_is_a_fw_bw_compiler():
    program, b, xs = _mlp()
    fn = fireclay_cpp.cpp_backend(program, xs)
    out = fn(*xs)
    assert isinstance(out, tuple) and len(out) == 2


def test_dump_writes_wrapper_and_cpp(tmp_path):
    program, b, xs = _mlp()
    compiled = fireclay_cpp.compile_program(program)
    paths = compiled.dump(str(tmp_path / "out"))
    names = sorted(os.path.basename(p) for p in paths)
    assert names == ["kernels0.cpp", "schedule.txt", "wrapper.py"]
    wrapper = (tmp_path / "out" / "wrapper.py").read_text()
    compile(wrapper, "wrapper.py", "exec")  # valid Python
    assert "op_aten_addmm_default(" in wrapper
    cpp = (tmp_path / "out" / "kernels0.cpp").read_text()
    for k in compiled.scheduled.kernels:  # each kernel is called from a run the wrapper calls
        assert f'extern "C" void {k.name}(' in cpp and f"  {k.name}(" in cpp and k.name in wrapper
    assert 'extern "C" void run0(const int64_t* fc_args)' in cpp and "run0(packrun0(" in wrapper


def test_wrong_inputs_are_reported():
    program, b, xs = _mlp()
    compiled = fireclay_cpp.compile_program(program)
    with pytest.raises(fireclay_cpp.InputError, match="takes 3 inputs, got 2"):
        compiled(*xs[:2])
    with pytest.raises(fireclay_cpp.InputError, match="compile again"):
        compiled(xs[0].double(), *xs[1:])
    with pytest.raises(fireclay_cpp.InputError, match="compiled for"):
        compiled(torch.randn(7, 10), *xs[1:])


def test_complex_inputs_compile_as_library_calls():
    """Loop bodies have no complex arithmetic: ops on complex tensors are library calls (they were
    a CodegenError, which sent the graph to the interpreter)."""
    x, y = torch.randn(3, 4, dtype=torch.complex64), torch.randn(3, 4, dtype=torch.complex64)
    b = AtenBuilder()
    program = b.output(b.call("mul.Tensor", b.input(x), b.input(y, "y")))
    torch.testing.assert_close(fireclay_cpp.compile_program(program)(x, y)[0], x * y)


def test_many_kernels_are_split_over_libraries_built_together(monkeypatch):
    from fireclay_cpp import api
    from fireclay_cpp.kernel_codegen import KernelSource

    kernels = [KernelSource(name=f"kernel{i}", source="", buffers=[], symbols=[], accumulators=[]) for i in range(60)]
    monkeypatch.setattr(api.os, "cpu_count", lambda: 4)
    groups = api.library_sources(kernels)
    assert len(groups) == 3 and [k for g in groups for k in g] == kernels  # order kept, none lost
    assert api.library_sources(kernels[:5]) == [kernels[:5]]
    assert api.library_sources([]) == []


def _with_weights(requires_grad: bool):
    """The MLP with w and b as the program's parameters (data held by the program)."""
    from fireclay_ir import InputSpec, Weight

    program, b, xs = _mlp()
    graph = program.main
    for pos, name in ((1, "w"), (2, "b")):
        graph.input_specs[pos] = InputSpec("parameter", name)
        data = xs[pos].clone().requires_grad_(requires_grad)
        program.weights[name] = Weight(graph.inputs[pos].type, data)
    return program, b, xs


@pytest.mark.parametrize("requires_grad", [False, True])
@pytest.mark.parametrize("stage", ["aten", "saved loops"])
def test_compiled_program_binds_its_weights(stage, requires_grad, tmp_path):
    """Called with the user inputs alone, a compiled program takes its weights from the program,
    also when they require grad (as a module's parameters do) and after a save and load of the
    loops program (read back with fireclay_loops.from_program by compile_program itself)."""
    import fireclay_ir
    from fireclay_loops import to_program

    program, b, xs = _with_weights(requires_grad)
    if stage == "saved loops":
        path = str(tmp_path / "p.fcir.json")
        fireclay_ir.save(to_program(schedule(lower(program))), path)
        program = fireclay_ir.load(path)
    compiled = fireclay_cpp.compile_program(program, [xs[0]])
    for _ in range(2):
        x = torch.randn_like(xs[0])
        for g, w in zip(compiled(x), b.eager(x, xs[1], xs[2])):
            torch.testing.assert_close(g, w, atol=1e-5, rtol=1e-5)
    # every input, weights included, still works
    for g, w in zip(compiled(xs[0], xs[1], xs[2]), b.eager(*xs)):
        torch.testing.assert_close(g, w, atol=1e-5, rtol=1e-5)
    with pytest.raises(fireclay_cpp.InputError, match="takes 3 inputs \\(or its 1 user inputs"):
        compiled(xs[0], xs[1])
