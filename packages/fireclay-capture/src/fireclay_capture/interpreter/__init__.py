"""The symbolic bytecode interpreter: one handler per opcode, grouped by family.

``frame.Frame`` runs a code object over Vars; the ``ops_*`` modules register the handlers.
"""

from fireclay_capture.interpreter import (  # noqa: F401
    ops_build,
    ops_call,
    ops_control,
    ops_except,
    ops_load_store,
    ops_stack,
)
from fireclay_capture.interpreter.frame import HANDLERS, Frame, bind_arguments

__all__ = ["HANDLERS", "Frame", "bind_arguments"]
