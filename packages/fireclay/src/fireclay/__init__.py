"""fireclay: a graph-mode compiler for PyTorch, built from separable stages.

    import fireclay
    model = fireclay.compile(model)            # like torch.compile
    fireclay.list_backends()                   # eager, aot_eager, fireclay, inductor, ...
    fireclay.set_stance("force_eager")         # like torch.compiler.set_stance
    fireclay.wait_compiled()                   # CUDA kernels compiling in the background: wait
    with fireclay.config.patch(verify_correctness=True): ...

Entry point: :func:`fireclay.compile` (``fireclay.api``).

``import fireclay`` is light: the configuration and logging are loaded at once, the stages (and
torch) when a name that needs them is first used, so that ``fireclay --help`` answers at once.
"""

from __future__ import annotations

import importlib
import importlib.util
from typing import Any

__version__ = "0.1.0"

from fireclay import logs  # noqa: E402,F401
from fireclay.config import Config, config  # noqa: E402  (reads the FIRECLAY_* variables)

# Siblings checked for a compatible version when the stages are first loaded; fireclay-triton
# only where it is installed (it is the `cuda` extra: a CPU-only install goes without it).
SIBLINGS = [
    ("fireclay_ir", "fireclay-ir"), ("fireclay_shapes", "fireclay-shapes"),
    ("fireclay_capture", "fireclay-capture"), ("fireclay_autograd", "fireclay-autograd"),
    ("fireclay_loops", "fireclay-loops"), ("fireclay_cpp", "fireclay-cpp"),
]
OPTIONAL_SIBLINGS = [("fireclay_triton", "fireclay-triton")]

# public name -> the module it comes from, imported on first use
_LAZY: dict[str, str] = {
    **dict.fromkeys(["OptimizedModule", "compile", "reset"], "fireclay.api"),
    **dict.fromkeys(["BackendNotFound", "list_backends", "lookup_backend", "register_backend"], "fireclay.backends"),
    **dict.fromkeys(["cache_stats", "reset_cache_stats"], "fireclay.compile_cache"),
    **dict.fromkeys(["list_mode_options", "list_modes"], "fireclay.modes"),
    "wait_compiled": "fireclay.tiered",
    "BackendCompilerFailed": "fireclay.fallback",
    **dict.fromkeys(["RecompileError", "allow_in_graph", "cond", "disable", "explain", "graph_break", "is_compiling",
                     "mark_dynamic", "set_stance"], "fireclay_capture"),
}

_stages_loaded = False


def _load_stages() -> None:
    """Check the siblings' versions and hook the stage timer into capture (once)."""
    global _stages_loaded
    if _stages_loaded:
        return
    from fireclay_ir import require_sibling

    for module, dist in SIBLINGS:
        require_sibling("fireclay", __version__, module, dist)
    for module, dist in OPTIONAL_SIBLINGS:
        if importlib.util.find_spec(module) is not None:
            try:
                require_sibling("fireclay", __version__, module, dist)
            except ImportError as exc:
                if type(exc) is not ImportError and type(exc) is not ModuleNotFoundError:
                    raise  # a version mismatch, not a missing triton
    from fireclay import stages

    stages.install()
    _stages_loaded = True


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'fireclay' has no attribute {name!r}")
    _load_stages()
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_LAZY))


__all__ = ["Config", "config", *sorted(_LAZY)]
