"""Entry points: compile a program to C++ and get a callable; the fw/bw compiler backend.

The pipeline is a chain of named artifacts, each kept on the result and dumpable:
scheduled program -> kernel C++ (one function per kernel) -> library source(s) -> shared
libraries (cached) -> wrapper Python source -> callable.
"""

from __future__ import annotations

import ctypes
import math
import os
from collections.abc import Callable, Sequence
from typing import Any

import torch

from fireclay_cpp import runtime
from fireclay_cpp.build import build_libraries
from fireclay_cpp.config import Config, config
from fireclay_cpp.kernel_codegen import KernelSource, generate_kernel, simd_reductions
from fireclay_cpp.prelude import PRELUDE
from fireclay_cpp.wrapper_codegen import ExternCalls, generate_wrapper
from fireclay_loops import ScheduledProgram, exprs
from fireclay_loops.backend import to_scheduled

KERNELS_PER_LIBRARY = 24  # above this, a program's kernels are split over libraries built in parallel


def generate_kernels(scheduled: ScheduledProgram, cfg: Config = config) -> list[KernelSource]:
    prog = scheduled.program
    return [generate_kernel(k, lambda b: prog.buffers[b].dtype, prog.hint, cfg.resolved_threads(),
                            buffer_extent=lambda b: buffer_extent(prog.buffers[b]),
                            buffer_numel=lambda b: prog.buffers[b].storage_numel)
            for k in scheduled.kernels]


def buffer_extent(buf: Any) -> tuple[int, int] | None:
    """The least and greatest index of a buffer's elements (its memory spans them: the kernel is
    given the whole of it), for a static layout with at least one element; None otherwise."""
    low = exprs.to_static(buf.offset)
    if low is None:
        return None
    high = low
    for n, st in zip(buf.size, buf.stride):
        n, st = exprs.to_static(n), exprs.to_static(st)
        if n is None or st is None:
            return None
        if n == 0:
            return None
        low, high = low + min(0, (n - 1) * st), high + max(0, (n - 1) * st)
    return low, high


def library_sources(kernels: list[KernelSource], cfg: Config = config) -> list[list[KernelSource]]:
    """Kernels grouped into libraries: one library, or for many kernels up to one per CPU."""
    if len(kernels) <= KERNELS_PER_LIBRARY:
        return [kernels] if kernels else []
    groups = min(os.cpu_count() or 1, math.ceil(len(kernels) / KERNELS_PER_LIBRARY))
    size = math.ceil(len(kernels) / groups)
    return [kernels[i:i + size] for i in range(0, len(kernels), size)]


def compile_program(program: Any, example_inputs: Sequence[torch.Tensor] | None = None, *,
                    cfg: Config | None = None) -> runtime.CompiledProgram:
    """Compile a program for the CPU; returns a callable taking the program's inputs.

    ``program``: an aten-dialect ``fireclay_ir.Program``, a loops-dialect one (as ``fireclay loops``
    saves it; ``fireclay_loops.from_program`` reads it back, which this does for you), a
    ``fireclay_loops.LoopProgram`` or a ``ScheduledProgram``. The result takes every input of the
    program, or only its user inputs: parameters, buffers and constants are then bound from the
    program's weights (as a captured program's callable does). ``example_inputs``, when given, are checked against the program's
    inputs now rather than at the first call.
    """
    cfg = cfg or config
    scheduled = to_scheduled(program)
    kernels = generate_kernels(scheduled, cfg)
    groups = library_sources(kernels, cfg)
    library_of = {k.name: i for i, group in enumerate(groups) for k in group}
    externs = ExternCalls(runtime.returns_one_tensor, runtime.linear_out() is not None, cfg.keep_arena_bytes,
                          runtime.may_alias_argument, cfg.reuse_arena_bytes)
    wrapper = generate_wrapper(scheduled, {k.name: (k.buffers, k.symbols) for k in kernels}, library_of,
                               runtime.out_argument, externs, {k.name: k.checks for k in kernels if k.checks})
    sources = [PRELUDE + simd_reductions([t for k in group for t in k.accumulators]) + "\n"
               + "\n".join(k.source for k in group) + "\n"
               + "".join(r.source for r in wrapper.runs if r.library == i) for i, group in enumerate(groups)]
    libraries = build_libraries(sources, cfg)
    namespace: dict[str, Any] = {"torch": torch, "as_base": runtime.as_base, "typed": runtime.typed,
                                 "view": runtime.view, "conform": runtime.conform,
                                 "tensor_types": (torch.Tensor, torch.nn.Parameter),
                                 "get_num_threads": torch.get_num_threads, "linear": runtime.linear_out(),
                                 "workspaces": [], "raise_check_failure": runtime.raise_check_failure,
                                 "take_arena": runtime.arena_store.take, "give_arena": runtime.arena_store.give}
    for run in wrapper.runs:
        namespace[run.name] = runtime.bind_run(libraries[run.library].handle, run.name, run.checks)
        namespace["pack" + run.name] = ctypes.c_int64 * run.slots
    for var, op in wrapper.namespace_ops.items():
        namespace[var] = runtime.extern_op(op)
    for var, op in wrapper.out_ops.items():
        namespace[var] = runtime.out_op(op)
    namespace.update(wrapper.constants)
    header = "# generated by fireclay-cpp: the call sequence of one scheduled program\n"
    text = header + wrapper.text
    exec(compile(text, "<fireclay-cpp wrapper>", "exec"), namespace)
    compiled = runtime.CompiledProgram(scheduled, text, sources, libraries, namespace["call"])
    if example_inputs is not None:
        _check_examples(scheduled, example_inputs)
    return compiled


def _check_examples(scheduled: ScheduledProgram, inputs: Sequence[Any]) -> None:
    prog = scheduled.program
    if len(inputs) not in (len(prog.inputs), len(prog.inputs) - len(prog.input_specs)):
        raise runtime.InputError(f"the program takes {len(prog.inputs)} inputs, {len(inputs)} examples were given")


def cpp_backend(aten_program: Any, example_inputs: Sequence[torch.Tensor]) -> Callable[..., tuple]:
    """A forward/backward compiler: ``(aten program, example inputs) -> callable``."""
    return compile_program(aten_program, example_inputs)
