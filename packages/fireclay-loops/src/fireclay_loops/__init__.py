"""fireclay-loops: lowering aten programs to a define-by-run loop IR, scheduling, fusion and
memory planning.

Entry points::

    loop_program = lower(aten_program)          # aten Program -> LoopProgram
    scheduled = schedule(loop_program)          # fused kernels, order, memory plan
    print(scheduled)                            # the scheduled program as text
    print(scheduled.report())                   # kernels, bytes moved, decisions and reasons
    program = to_program(scheduled)             # as a fireclay-ir Program in the loops dialect

Importing the package registers the ``loops`` dialect with fireclay-ir.
``fireclay_loops.reference.run(scheduled, *tensors)`` runs a scheduled program with torch (the
``torch`` extra); importing this package never imports torch.
Code generators are renderers over one kit, ``fireclay_loops.backend``: the scheduled program,
values, scopes, placement, common subexpressions, stages, reduction kinds and wrapper text;
``fireclay_loops.backend.runtime`` holds the tensor helpers a generated wrapper runs with (needs
torch; imported only by generators). Every stage's disk cache lives in one folder of the
user's, checked before anything in it is trusted: ``fireclay_loops.cache_dirs``.
"""

__version__ = "0.1.0"

from fireclay_ir import require_sibling

require_sibling("fireclay-loops", __version__, "fireclay_ir", "fireclay-ir")
require_sibling("fireclay-loops", __version__, "fireclay_shapes", "fireclay-shapes")

from fireclay_loops.body import BodyRecorder, BodyValue, LoopBody, record_body  # noqa: E402
from fireclay_loops.config import Config, config  # noqa: E402
from fireclay_loops.dialect import from_program, register, to_program  # noqa: E402

register()  # the loops dialect, so that fireclay-ir can verify and load loops programs
from fireclay_loops.backend.program import Report, ScheduledProgram  # noqa: E402
from fireclay_loops.errors import (  # noqa: E402
    IndexOutOfBounds,
    IntegerDivisionByZero,
    LoweringError,
    SchedulingError,
    check_failure,
)
from fireclay_loops.ir import (  # noqa: E402
    Buffer,
    ComputeNode,
    Constant,
    ExternNode,
    InputBufferNode,
    LoopNode,
    LoopProgram,
    OutputBufferNode,
    TensorArg,
)
from fireclay_loops.kernel import Kernel, KernelNode  # noqa: E402
from fireclay_loops.lowering.driver import accelerator, lower  # noqa: E402
from fireclay_loops.lowering.registry import register_lowering  # noqa: E402
from fireclay_loops.memory import MemoryPlan  # noqa: E402
from fireclay_loops.ops import ops, use_handler  # noqa: E402
from fireclay_loops.printer import format_loop_program, format_schedule  # noqa: E402
from fireclay_loops.scheduler import Decision, schedule  # noqa: E402
from fireclay_loops.verify import verify_schedule  # noqa: E402

__all__ = [
    "accelerator", "BodyRecorder", "BodyValue", "Buffer", "Config", "config", "from_program", "to_program", "verify_schedule", "ComputeNode", "Constant", "Decision", "ExternNode",
    "IndexOutOfBounds", "InputBufferNode", "IntegerDivisionByZero", "check_failure", "Kernel", "KernelNode", "LoopBody", "LoopNode", "LoopProgram", "LoweringError",
    "MemoryPlan", "OutputBufferNode", "Report", "ScheduledProgram", "SchedulingError", "TensorArg",
    "format_loop_program", "format_schedule", "lower", "ops", "record_body", "register_lowering",
    "schedule", "use_handler",
]
