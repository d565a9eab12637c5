"""fireclay-cpp: C++/OpenMP code generation for scheduled loop programs.

Entry point::

    compiled = compile_program(aten_program, example_inputs)   # or a LoopProgram / ScheduledProgram
    outputs = compiled(*tensors)                                # a tuple of tensors
    compiled.dump("out/")                                       # wrapper.py, kernels0.cpp, schedule.txt

``cpp_backend`` is the same as a forward/backward compiler ``(aten_program, example_inputs) ->
callable``. Importing the package does not import torch; compiling does. Libraries are cached on disk (``FIRECLAY_CACHE_DIR``); see :mod:`fireclay_cpp.config`.
"""

__version__ = "0.1.0"

from fireclay_ir import require_sibling

require_sibling("fireclay-cpp", __version__, "fireclay_ir", "fireclay-ir")
require_sibling("fireclay-cpp", __version__, "fireclay_shapes", "fireclay-shapes")
require_sibling("fireclay-cpp", __version__, "fireclay_loops", "fireclay-loops")

from fireclay_cpp.build import Library, build_libraries, build_library, cache_key  # noqa: E402
from fireclay_cpp.config import Config, config  # noqa: E402
from fireclay_cpp.errors import BuildError, CodegenError, CppBackendError  # noqa: E402

# These need torch: imported on first use, so that building and caching alone stay light.
_LAZY = {"compile_program": "api", "cpp_backend": "api", "generate_kernels": "api", "to_scheduled": "api",
         "CompiledProgram": "runtime", "InputError": "runtime"}


def __getattr__(name: str):
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(f"fireclay_cpp.{_LAZY[name]}"), name)
    raise AttributeError(f"module 'fireclay_cpp' has no attribute {name!r}")


__all__ = [
    "BuildError", "CodegenError", "CompiledProgram", "Config", "CppBackendError", "InputError", "Library",
    "build_libraries", "build_library", "cache_key", "compile_program", "config", "cpp_backend",
    "generate_kernels", "to_scheduled",
]
