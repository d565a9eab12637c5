"""fireclay: a graph-mode compiler for PyTorch, built from separable stages.

    import fireclay
    model = fireclay.compile(model)            # like torch.compile
    fireclay.list_backends()                   # eager, aot_eager, fireclay, inductor, ...
    fireclay.wait_compiled()                   # CUDA kernels compiling in the background: wait
    with fireclay.config.patch(verify_correctness=True): ...

Entry point: :func:`fireclay.compile` (``fireclay.api``).
"""

__version__ = "0.1.0"

from fireclay_ir import require_sibling

for _module, _dist in [
    ("fireclay_ir", "fireclay-ir"), ("fireclay_shapes", "fireclay-shapes"),
    ("fireclay_capture", "fireclay-capture"), ("fireclay_autograd", "fireclay-autograd"),
    ("fireclay_loops", "fireclay-loops"), ("fireclay_cpp", "fireclay-cpp"),
    ("fireclay_triton", "fireclay-triton"),
]:
    require_sibling("fireclay", __version__, _module, _dist)

from fireclay import logs  # noqa: E402,F401  (reads FIRECLAY_LOG)
from fireclay.api import OptimizedModule, compile, reset  # noqa: E402
from fireclay.backends import BackendNotFound, list_backends, lookup_backend, register_backend  # noqa: E402
from fireclay.compile_cache import cache_stats, reset_cache_stats  # noqa: E402
from fireclay.config import Config, config  # noqa: E402
from fireclay.modes import list_mode_options, list_modes  # noqa: E402
from fireclay.tiered import wait_compiled  # noqa: E402
from fireclay_capture import (  # noqa: E402
    allow_in_graph,
    cond,
    disable,
    explain,
    graph_break,
    is_compiling,
    mark_dynamic,
)

__all__ = [
    "BackendNotFound", "Config", "OptimizedModule", "allow_in_graph", "cache_stats", "compile", "cond", "config",
    "disable", "explain", "graph_break", "is_compiling", "list_backends", "list_mode_options",
    "list_modes", "lookup_backend", "mark_dynamic", "register_backend", "reset", "reset_cache_stats", "wait_compiled",
]
