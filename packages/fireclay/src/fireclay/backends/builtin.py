"""The built-in backends: eager, aot_eager and fireclay (the full pipeline)."""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from fireclay_autograd import aot_backend, interpreter_backend
from fireclay_capture.backends import eager as _capture_eager
from fireclay_ir import Program

Compiled = Callable[..., Any]

log = logging.getLogger("fireclay")


def eager(program: Program, example_inputs: list) -> Compiled:
    """Run the captured torch-dialect program in fireclay-ir's interpreter."""
    return _capture_eager(program, example_inputs)


def aot_eager(program: Program, example_inputs: list) -> Compiled:
    """Trace to aten, functionalize and partition forward/backward; run both halves in the
    interpreter. Shows what the autograd stage does, without code generation."""
    return aot_backend(interpreter_backend, interpreter_backend)(program, example_inputs)


def _codegen_compiler(program: Program, example_inputs: list) -> Compiled:
    """Generate code for one aten graph: Triton for CUDA tensors, C++ for CPU tensors."""
    devices = {str(getattr(x, "device", "cpu")).split(":")[0] for x in example_inputs}
    if "cuda" in devices:
        from fireclay_triton import compile_program as compile_for_gpu

        return compile_for_gpu(program, example_inputs)
    from fireclay_cpp import compile_program as compile_for_cpu

    return compile_for_cpu(program, example_inputs)


def _codegen_or_interpreter(program: Program, example_inputs: list) -> Compiled:
    """Code generation for one aten graph; if it fails, that graph runs in the interpreter (a
    warning says why), so a gap in code generation costs speed, never a wrong answer."""
    try:
        return _codegen_compiler(program, example_inputs)
    except Exception as exc:
        first = str(exc).splitlines()[0] if str(exc) else ""
        log.warning("fireclay: code generation failed for an aten graph (%s: %s); running it in the "
                    "interpreter instead", type(exc).__name__, first)
        return interpreter_backend(program, example_inputs)


def fireclay(program: Program, example_inputs: list) -> Compiled:
    """The whole pipeline: autograd → loops → cpp (CPU) or triton (CUDA)."""
    return aot_backend(_codegen_or_interpreter, _codegen_or_interpreter)(program, example_inputs)
