"""fireclay-capture: Bytecode-level frame capture of PyTorch programs.

Entry point: :func:`capture` (``fireclay_capture.api``). The symbolic bytecode interpreter is in
``fireclay_capture.interpreter``, abstract values in ``fireclay_capture.variables``, guards in
``fireclay_capture.guards`` and the per-code cache in ``fireclay_capture.cache``.
"""

__version__ = "0.1.0"

from fireclay_ir import require_sibling

require_sibling("fireclay-capture", __version__, "fireclay_ir", "fireclay-ir")
require_sibling("fireclay-capture", __version__, "fireclay_shapes", "fireclay-shapes")

from fireclay_capture.api import CapturedFunction, RecompileError, capture  # noqa: E402
from fireclay_capture.backends import lookup_backend, register_backend  # noqa: E402
from fireclay_capture.cond import cond  # noqa: E402
from fireclay_capture.config import CaptureSettings, config  # noqa: E402
from fireclay_capture.controls import allow_in_graph, disable, graph_break, is_compiling  # noqa: E402
from fireclay_capture.dynamic import mark_dynamic  # noqa: E402
from fireclay_capture.errors import CaptureError  # noqa: E402
from fireclay_capture.explain import Explanation, explain  # noqa: E402
from fireclay_capture.stance import set_stance  # noqa: E402

__all__ = ["CaptureError", "CaptureSettings", "allow_in_graph", "CapturedFunction", "Explanation", "capture", "cond", "config", "disable", "explain", "graph_break", "is_compiling",
           "lookup_backend", "mark_dynamic", "RecompileError", "register_backend", "set_stance"]
