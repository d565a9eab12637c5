"""fireclay-triton: Triton code generation for scheduled loop programs (the GPU backend).

Entry point::

    compiled = compile_program(aten_program, example_inputs)   # or a LoopProgram / ScheduledProgram
    outputs = compiled(*tensors)                                # a tuple of tensors
    compiled.dump("folder")                                     # kernels.py, wrapper.py, schedule.txt

``compile_program(..., background=True)`` returns before the kernels are compiled: they compile
on a background thread, ``compiled.ready()`` / ``compiled.wait()`` / ``compiled.compile_error``
say when and whether it is usable, and ``wait_compiled()`` waits for every such compile
(:mod:`fireclay_triton.background`).
``triton_backend`` is the same as a forward/backward compiler ``(program, inputs) -> callable``;
``cudagraphify(callable, example_inputs)`` runs any such callable through CUDA graphs
(``mode="reduce-overhead"``; :mod:`fireclay_triton.cudagraphs`). ``prewarm()`` starts a fresh
process's one-time compiler costs on a daemon thread, early (:mod:`fireclay_triton.warmup`).
Without a GPU, set ``TRITON_INTERPRET=1`` before triton is imported: kernels then run on CPU
tensors in Triton's interpreter (slow; for tests). Settings: :mod:`fireclay_triton.config`.
"""

__version__ = "0.1.0"

from fireclay_ir import require_sibling

require_sibling("fireclay-triton", __version__, "fireclay_ir", "fireclay-ir")
require_sibling("fireclay-triton", __version__, "fireclay_loops", "fireclay-loops")

from fireclay_triton.api import compile_program, generate_kernels, to_scheduled, triton_backend  # noqa: E402
from fireclay_triton.autotune import LaunchConfig  # noqa: E402
from fireclay_triton.background import wait_all as wait_compiled  # noqa: E402
from fireclay_triton.config import Config, config  # noqa: E402
from fireclay_triton.cudagraphs import CudaGraphed, cudagraphify  # noqa: E402
from fireclay_triton.errors import CodegenError, InputError, TritonBackendError  # noqa: E402
from fireclay_triton.kernel_codegen import KernelSource  # noqa: E402
from fireclay_triton.runtime import CompiledProgram  # noqa: E402
from fireclay_triton.warmup import prewarm  # noqa: E402

__all__ = [
    "CodegenError", "CompiledProgram", "Config", "CudaGraphed", "InputError", "KernelSource", "LaunchConfig",
    "TritonBackendError", "compile_program", "config", "cudagraphify", "generate_kernels", "prewarm", "to_scheduled",
    "triton_backend", "wait_compiled",
]
