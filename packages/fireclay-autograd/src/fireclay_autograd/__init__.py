"""fireclay-autograd: ATen-level graphs, functionalization, joint graphs, partitioning.

Entry points: :func:`compile_program` (a torch-dialect Program -> a callable with autograd
support), :func:`aot_backend` (the same as a capture backend), :func:`trace_to_aten` (the
functional aten graph of the inference path) and :func:`aot_graphs` (the forward/backward pair
and its saved-tensor signature).

Pipeline, in order: ``tracer`` (record aten calls over fake tensors, decomposing non-core ops
as ``decompose`` says) -> ``joint`` (forward, and backward through torch's autograd) ->
``functionalize`` (no mutation or aliasing left) -> ``partition`` (min-cut into forward and
backward) -> ``runtime`` (a torch.autograd.Function around the compiled halves).
"""

from fireclay_autograd.version import __version__
from fireclay_ir import require_sibling

require_sibling("fireclay-autograd", __version__, "fireclay_ir", "fireclay-ir")
require_sibling("fireclay-autograd", __version__, "fireclay_shapes", "fireclay-shapes")

from fireclay_autograd.api import (  # noqa: E402
    AOTGraphs,
    CompiledProgram,
    aot_backend,
    aot_graphs,
    compile_program,
    interpreter_backend,
    ir_interpreter_backend,
    trace_to_aten,
)
from fireclay_autograd.artifacts import (  # noqa: E402
    ArtifactError,
    InferenceArtifact,
    TrainingArtifact,
    dumps_artifact,
    loads_artifact,
)
from fireclay_autograd.core_ops import CORE_OPS, is_core  # noqa: E402
from fireclay_autograd.dynamo_backend import dynamo_backend  # noqa: E402
from fireclay_autograd.functionalize import functionalize  # noqa: E402
from fireclay_autograd.partition import Partition, SavedTensor, is_recomputable, partition  # noqa: E402
from fireclay_autograd.runtime import DoubleBackwardError  # noqa: E402
from fireclay_autograd.tracer import AtenTracer, TracingError  # noqa: E402

__all__ = [
    "AOTGraphs", "ArtifactError", "AtenTracer", "InferenceArtifact", "TrainingArtifact", "dumps_artifact",
    "loads_artifact", "CORE_OPS", "CompiledProgram", "DoubleBackwardError", "Partition",
    "SavedTensor", "TracingError", "aot_backend", "aot_graphs", "compile_program", "dynamo_backend", "functionalize",
    "interpreter_backend", "ir_interpreter_backend", "is_core", "is_recomputable", "partition", "trace_to_aten",
]
