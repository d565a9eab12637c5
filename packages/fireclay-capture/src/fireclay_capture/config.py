"""fireclay-capture's settings section (``fireclay_capture.config``): each field is read from
``FIRECLAY_CAPTURE_<NAME>`` when the package is imported (:mod:`fireclay_ir.settings`), can be
assigned at run time, and set for a block with ``config.patch(...)``; docs/settings.md lists
them all."""

from __future__ import annotations

import dataclasses

from fireclay_ir.settings import Settings, setting


@dataclasses.dataclass
class CaptureSettings(Settings, section="capture"):
    recompile_limit: int = setting(8, "cache entries allowed per code object before the frame is left to run "
                                      "eagerly")
    max_inline_depth: int = setting(48, "deepest chain of inlined user calls; deeper recursion is reported as "
                                        "unsupported")
    max_instructions: int = setting(2_000_000, "bytecode instructions one capture may execute (guards "
                                               "against runaway unrolled loops)")
    automatic_dynamic: bool = setting(True, "after a guard fails on a size, re-capture with that dimension "
                                            "dynamic")
    graph_breaks: bool = setting(True, "split a function at code the capture cannot trace (a graph break) "
                                       "instead of running the whole function eagerly")
    max_resume_depth: int = setting(32, "resume functions that may run nested inside one another; deeper, "
                                        "the rest of the function runs as plain Python")
    # Changes to objects that exist outside the frame (attributes of objects and modules, globals,
    # lists and dicts, closure cells) are modelled during the trace and replayed on the real
    # objects after the graph runs.
    replay_side_effects: bool = setting(True, "replay changes to objects outside the frame after the graph "
                                              "runs (off: such a change is a graph break)")
    # A compile allocates hundreds of thousands of objects; each full collection they trigger
    # walks every object of the process (torch's and the user's too), which costs a fifth of a
    # large model's compile. The cycles made meanwhile (IR graphs) are collected once the
    # collector runs again.
    pause_gc: bool = setting(True, "pause the cyclic garbage collector while a frame is captured and compiled")
    # As torch.compiler.set_stance: ``default`` captures and compiles; ``force_eager`` runs every
    # captured function eagerly; ``eager_on_recompile`` uses graphs already compiled and runs
    # eagerly where a new capture would be needed; ``fail_on_recompile`` raises RecompileError
    # there.
    stance: str = setting("default", "how compiled functions behave: default, force_eager, "
                                     "eager_on_recompile or fail_on_recompile (set_stance)")


config = CaptureSettings.from_environment()
