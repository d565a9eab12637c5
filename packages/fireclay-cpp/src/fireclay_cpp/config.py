"""fireclay-cpp's settings section (``fireclay_cpp.config``): each field is read from
``FIRECLAY_CPP_<NAME>`` when the package is imported (:mod:`fireclay_ir.settings`); docs/settings.md
lists them all. A compile may take its own copy (``compile_program(..., cfg=Config(...))``).

Compiled libraries are cached in the ``cpp/`` folder of the shared cache root
(``fireclay_ir.config.cache_dir``, ``FIRECLAY_CACHE_DIR``; :mod:`fireclay_loops.cache_dirs`), which
must be this user's alone.

On x86-64 glibc (2.22 and later) libraries link glibc's vector math library (``-lmvec``) and the
prelude declares its functions SIMD-callable (``-DFC_LIBMVEC``), so loops over exp, tanh, erf...
vectorise; both flags are part of the cache key.
"""

from __future__ import annotations

import functools
import os
import platform
import shlex
from dataclasses import dataclass

from fireclay_ir.settings import Settings, setting
from fireclay_loops.cache_dirs import default_root

# -fno-trapping-math: no code reads floating-point exception flags, and without it GCC will not
# turn a select whose arm divides (a mean's gradient masked by max pooling's) into a vector
# blend, so the whole loop stays scalar; results are the same bits either way.
DEFAULT_FLAGS = ("-O3", "-march=native", "-fopenmp", "-shared", "-fPIC", "-std=c++17", "-fno-math-errno",
                 "-fno-trapping-math", "-w")
DEFAULT_KEEP_ARENA_BYTES = 4 * 2**20
DEFAULT_REUSE_ARENA_BYTES = 2**30


@functools.cache
def _has_libmvec() -> bool:
    """glibc's vector math library: x86-64 glibc 2.22 and later."""
    if platform.machine() not in ("x86_64", "AMD64"):
        return False
    libc, version = platform.libc_ver()
    try:
        return libc == "glibc" and tuple(int(p) for p in version.split(".")[:2]) >= (2, 22)
    except ValueError:
        return False


@dataclass
class Config(Settings, section="cpp"):
    compiler: str = setting("", "the C++ compiler (empty: $CXX, else g++)")
    extra_flags: str = setting("", "compiler flags appended to the defaults, separated by spaces as on a "
                                   "command line")
    threads: int | None = setting(None, "the number of threads kernels are planned for (empty: the CPU count)")
    # Small programs spend more time making the arena and its views than in some of their
    # kernels. Large arenas kept by each program would add up over programs between calls: they
    # share the process's one block instead (reuse_arena_bytes), and make their views per call.
    keep_arena_bytes: int = setting(DEFAULT_KEEP_ARENA_BYTES, "the largest per-call arena (bytes) a compiled "
                                    "program keeps from one call to the next, with every view of it made "
                                    "once (0: none; larger arenas: reuse_arena_bytes)")
    # A larger arena made every call is memory the C library returns to the system and takes
    # again, one page fault per 4 KiB; one block kept for every such program stops that.
    reuse_arena_bytes: int = setting(DEFAULT_REUSE_ARENA_BYTES, "the largest arena (bytes) a program that does "
                                     "not keep its own takes from one block the process keeps between calls, "
                                     "and gives back after the call (0: a new arena every call)")

    def resolved_cache_dir(self) -> str:
        """This package's folder of the cache shared with the other stages."""
        return os.path.join(default_root(), "cpp")

    def resolved_compiler(self) -> str:
        return self.compiler or os.environ.get("CXX") or "g++"

    def flags(self) -> list[str]:
        vector_math = ["-DFC_LIBMVEC"] if _has_libmvec() else []
        return list(DEFAULT_FLAGS) + vector_math + shlex.split(self.extra_flags)

    def link_flags(self) -> list[str]:
        """Libraries to link, after the source (the linker drops a library named before its users)."""
        return ["-lmvec"] if _has_libmvec() else []

    def resolved_threads(self) -> int:
        return self.threads or os.cpu_count() or 1


config = Config.from_environment()
