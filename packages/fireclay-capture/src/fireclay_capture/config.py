"""Capture settings. Each can be set from the environment (``FIRECLAY_CAPTURE_<NAME>``) or by
assigning ``fireclay_capture.config.<name>`` at run time."""

from __future__ import annotations

import os


def _env_int(name: str, default: int) -> int:
    raw = os.environ.get(f"FIRECLAY_CAPTURE_{name}")
    return int(raw) if raw else default


#: Cache entries allowed per code object before the frame is left to run eagerly.
recompile_limit: int = _env_int("RECOMPILE_LIMIT", 8)

#: Deepest chain of inlined user calls; deeper recursion is reported as unsupported.
max_inline_depth: int = _env_int("MAX_INLINE_DEPTH", 48)

#: Bytecode instructions one capture may execute (guards against runaway unrolled loops).
max_instructions: int = _env_int("MAX_INSTRUCTIONS", 2_000_000)

#: After a guard fails on a size, re-capture with that dimension dynamic (needs symbolic shapes).
automatic_dynamic: bool = bool(_env_int("AUTOMATIC_DYNAMIC", 1))

#: Split a function at code the capture cannot trace (a graph break) instead of running the
#: whole function eagerly.
graph_breaks: bool = bool(_env_int("GRAPH_BREAKS", 1))

#: Resume functions that may run nested inside one another (a loop that breaks on every
#: iteration nests one per iteration); deeper, the rest of the function runs as plain Python.
max_resume_depth: int = _env_int("MAX_RESUME_DEPTH", 32)

#: Changes to objects that exist outside the frame (attributes of objects and modules, globals,
#: lists and dicts, closure cells) are modelled during the trace and replayed on the real objects
#: after the graph runs. When off, such a change is a graph break (it runs in plain Python).
replay_side_effects: bool = bool(_env_int("REPLAY_SIDE_EFFECTS", 1))

#: Pause the cyclic garbage collector while a frame is captured and compiled (its first call
#: included), and resume it afterwards. A compile allocates hundreds of thousands of objects;
#: each full collection they trigger walks every object of the process (torch's and the user's
#: too), which costs a fifth of a large model's compile. The cycles made meanwhile (IR graphs)
#: are collected once the collector runs again.
pause_gc: bool = bool(_env_int("PAUSE_GC", 1))

#: How compiled functions behave (``set_stance``, as ``torch.compiler.set_stance``): ``default``
#: captures and compiles; ``force_eager`` runs every captured function eagerly; ``eager_on_recompile``
#: uses graphs already compiled and runs eagerly where a new capture would be needed;
#: ``fail_on_recompile`` raises ``RecompileError`` where a new capture would be needed.
stance: str = os.environ.get("FIRECLAY_CAPTURE_STANCE") or "default"
