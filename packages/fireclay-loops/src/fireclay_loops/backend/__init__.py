"""What every code generator of a scheduled program needs, written once: a backend is a renderer
of op templates and hooks over it.

* :class:`ScheduledProgram` (with its :class:`Report`), what fireclay-loops hands to backends,
  and :func:`to_scheduled`, whatever program a backend is given, scheduled;
* the kernel-emission kit (:mod:`fireclay_loops.backend.kernel`): values, scopes and placement,
  common subexpressions, stages, an ops handler with one method per op and per reduction kind;
* :mod:`fireclay_loops.backend.reductions`: each reduction kind as data (:class:`ReductionForm`:
  its state, start, fold and merge), which a generator renders in its own spelling;
* wrapper text (:mod:`fireclay_loops.backend.wrapper_text`): sizes, literals, extern calls;
* :mod:`fireclay_loops.backend.runtime`: the tensor helpers a generated wrapper runs with. It
  needs torch, so it is imported only by the generators that use it, never from here.

``docs/writing-a-backend.md`` builds a small renderer on this kit.
"""

from fireclay_loops.backend.kernel import (
    CheckSite,
    KernelEmitter,
    KernelOps,
    KernelSource,
    Scope,
    StagePlan,
    Value,
    indent,
)
from fireclay_loops.backend.program import Report, ScheduledProgram
from fireclay_loops.backend.reductions import REDUCTIONS, ReductionForm
from fireclay_loops.backend.scheduling import to_scheduled
from fireclay_loops.backend.wrapper_text import WrapperText, constant_size, py_expr, py_shape

__all__ = ["REDUCTIONS", "CheckSite", "KernelEmitter", "KernelOps", "KernelSource", "ReductionForm", "Report",
           "ScheduledProgram", "Scope", "StagePlan", "Value", "WrapperText", "constant_size", "indent", "py_expr",
           "py_shape", "to_scheduled"]
