"""The built-in backends: eager, aot_eager and fireclay (the full pipeline)."""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable
from typing import Any

from fireclay import stages
from fireclay.compile_cache import AutogradArtifactCache, scheduled_program
from fireclay.config import config
from fireclay.fallback import first_source, guarded_codegen
from fireclay.tiered import tiered
from fireclay_autograd import aot_backend, compile_program, interpreter_backend
from fireclay_capture.backends import eager as _capture_eager
from fireclay_ir import Program
from fireclay_ir.stages import in_stage

Compiled = Callable[..., Any]

log = logging.getLogger("fireclay")


def eager(program: Program, example_inputs: list) -> Compiled:
    """Run the captured torch-dialect program in fireclay-ir's interpreter."""
    return _capture_eager(program, example_inputs)


def aot_eager(program: Program, example_inputs: list) -> Compiled:
    """Trace to aten, functionalize and partition forward/backward; run both halves in the
    interpreter. Shows what the autograd stage does, without code generation."""
    return aot_backend(interpreter_backend, interpreter_backend)(program, example_inputs)


def _codegen_compiler(program: Program, example_inputs: list, options: dict[str, Any] | None = None,
                      artifacts: AutogradArtifactCache | None = None,
                      record: stages.GraphRecord | None = None, role: str = "forward") -> Compiled:
    """Generate code for one aten graph: Triton for CUDA tensors, C++ for CPU tensors. The
    scheduled loop program comes from the compile cache when an earlier process made it.
    ``record`` names the graph for stage times, progress and ``config.debug_dir``; ``role``
    (forward, backward or inference) says which of its aten programs this is."""
    options = options or {}
    record = record or stages.new_graph(program, first_source(program))
    stages.program_made(record, f"aten {role}", program)
    origin = artifacts.origin(program) if artifacts is not None else None
    with stages.stage("loops", record.label), in_stage("lowering"):
        scheduled = scheduled_program(program, example_inputs, origin)
    if config.debug_dir or stages.listening():
        import fireclay_loops

        # Only for debug_dir and the report: timed as their own cost, not the compile's.
        with stages.stage("report and debug files", record.label):
            stages.program_made(record, f"loops {role}", fireclay_loops.to_program(scheduled))
    target = "triton" if _targets_gpu(example_inputs) or _makes_gpu_tensors(program) else "cpp"
    with stages.stage(target, record.label), in_stage("code generation"):
        compiled = _generate(scheduled, example_inputs, options, program, target)
    stages.code_made(record, role, target, compiled)
    return compiled


def _generate(scheduled: Any, example_inputs: list, options: dict[str, Any], program: Program, target: str) -> Compiled:
    if target == "triton":
        return _for_gpu(scheduled, example_inputs, options, program=program)
    import fireclay_cpp

    if options.get("cudagraphs"):
        _note_once("cudagraphs", "fireclay: option cudagraphs (mode reduce-overhead / max-autotune) applies to CUDA "
                                 "tensors only; these graphs run on the CPU, so it changes nothing here")
    if options.get("max_autotune"):
        _note_once("max_autotune_cpu", "fireclay: option max_autotune has no effect on CPU tensors: fireclay-cpp "
                                       "generates one variant per kernel and has nothing to search")
    return fireclay_cpp.compile_program(scheduled, example_inputs)


def _targets_gpu(example_inputs: list) -> bool:
    """Whether a graph goes to fireclay-triton: any of its inputs is a CUDA tensor."""
    return any(str(getattr(x, "device", "cpu")).startswith("cuda") for x in example_inputs)


def _makes_gpu_tensors(program: Program) -> bool:
    """Whether a graph whose inputs are all on the CPU makes CUDA tensors (``torch.arange(n,
    device="cuda")`` after a graph break that left only CPU values): its code is Triton's, its
    buffers on the GPU."""
    import fireclay_loops

    return fireclay_loops.accelerator(program) == "cuda"


def _for_gpu(scheduled: Any, example_inputs: list, options: dict[str, Any], program: Program | None = None) -> Compiled:
    """Triton code for one graph. With ``program`` (its aten program) and background compiles on
    (``config.background_compile``, not under CUDA graphs, which must record compiled kernels),
    the kernels compile in the background while the program runs in the interpreter
    (fireclay.tiered)."""
    fireclay_triton = gpu_code_generator()
    max_autotune = bool(options.get("max_autotune")) or None  # None: fireclay_triton.config's
    background = program is not None and config.background_compile and not options.get("cudagraphs")
    if background:
        compiled = fireclay_triton.compile_program(scheduled, example_inputs, background=True,
                                                   max_autotune=max_autotune)
        return tiered(compiled, lambda: interpreter_backend(program, example_inputs), first_source(program))
    compiled = fireclay_triton.compile_program(scheduled, example_inputs, max_autotune=max_autotune)
    if options.get("cudagraphs"):
        compiled = fireclay_triton.cudagraphify(compiled, list(example_inputs))
    return compiled


class CudaSupportMissing(ImportError):
    """A graph on CUDA tensors, and no fireclay-triton (or triton) installed."""


def gpu_code_generator() -> Any:
    """fireclay-triton, or an error saying how to install it: it is the umbrella's ``cuda`` extra,
    so a CPU-only install has neither it nor triton."""
    try:
        import fireclay_triton
    except ImportError as exc:
        raise CudaSupportMissing(
            f"this graph runs on CUDA tensors, which fireclay compiles with fireclay-triton, and it cannot be "
            f"imported ({exc}); install the CUDA extra: pip install 'fireclay[cuda]' (from a clone: pip install "
            "./packages/fireclay-triton)") from exc
    return fireclay_triton


def _prewarm_gpu_compiler() -> None:
    """Start Triton's one-time costs (a fresh process's first compile) while autograd and loops
    run (fireclay_triton.warmup)."""
    try:
        import fireclay_triton
    except ImportError:  # code generation reports the missing package when it gets there
        return
    fireclay_triton.prewarm()


_noted: set[str] = set()


def _note_once(topic: str, message: str) -> None:
    """Log ``message`` at INFO on ``fireclay.perf_hints`` the first time ``topic`` comes up in
    this process."""
    if topic not in _noted:
        _noted.add(topic)
        stages.hints_log.info(message)


def _codegen_or_interpreter(program: Program, example_inputs: list, options: dict[str, Any] | None = None,
                            artifacts: AutogradArtifactCache | None = None,
                            record: stages.GraphRecord | None = None, fullgraph: bool = False,
                            role: str = "forward") -> Compiled:
    """Code generation for one aten graph (``role``: forward, backward or inference); if it fails
    (or the generated code fails at a call), that graph runs in the interpreter with one warning
    saying why, so a gap in code generation costs speed, never a wrong answer or an error
    (``fullgraph``: the failure propagates)."""
    return guarded_codegen(lambda: _codegen_compiler(program, example_inputs, options, artifacts, record=record,
                                                     role=role),
                           lambda: interpreter_backend(program, example_inputs), program, fullgraph,
                           label=record.label if record is not None else None)


def fireclay(program: Program, example_inputs: list, options: dict[str, Any] | None = None,
             fullgraph: bool = False) -> Compiled:
    """The whole pipeline: autograd → loops → cpp (CPU) or triton (CUDA). ``options`` are the
    compile mode's (``cudagraphs``, ``max_autotune``: see ``fireclay.list_mode_options``).
    The autograd and loops stages' artifacts are reused across processes (fireclay.compile_cache).
    CUDA graphs run in the interpreter while their kernels compile in the background
    (``config.background_compile``; fireclay.tiered)."""
    if _targets_gpu(example_inputs):
        _prewarm_gpu_compiler()
    stages.forget_unfinished()
    record = stages.new_graph(program, first_source(program))
    stages.program_made(record, "captured", program)
    # The autograd stage traces at the first call; the artifact cache times it (stage_times),
    # and stage_timer where sizes are symbolic (traced at the first call of each new entry).
    artifacts = AutogradArtifactCache(program, example_inputs, record=record)
    codegen = functools.partial(_codegen_or_interpreter, options=dict(options or {}), artifacts=artifacts,
                                record=record, fullgraph=fullgraph)
    return compile_program(program, example_inputs, fw_compiler=codegen,
                           bw_compiler=functools.partial(codegen, role="backward"),
                           inference_compiler=functools.partial(codegen, role="inference"),
                           artifact_cache=artifacts,
                           stage_timer=lambda name: stages.stage(name, record.label),
                           # The capture's guards (or TorchDynamo's) check every input, weights included.
                           inputs_checked=True)
