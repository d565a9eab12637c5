"""fireclay-cpp's settings, each with its environment variable.

* ``FIRECLAY_CACHE_DIR``: the on-disk cache of compiled libraries (default
  ``$XDG_CACHE_HOME/fireclay`` or ``~/.cache/fireclay``, :mod:`fireclay_loops.cache_dirs`; the C++
  libraries go in its ``cpp/`` folder, which must be this user's alone);
* ``FIRECLAY_CXX`` (else ``CXX``): the C++ compiler (default ``g++``);
* ``FIRECLAY_CPP_FLAGS``: extra compiler flags, appended to the defaults;
* ``FIRECLAY_CPP_THREADS``: the number of threads kernels are planned for (default: CPU count);
* ``FIRECLAY_CPP_KEEP_ARENA``: the largest per-call arena (bytes) a compiled program keeps from one
  call to the next, with every view of it made once (default 4 MiB; 0: a new arena every call).

On x86-64 glibc (2.22 and later) libraries link glibc's vector math library (``-lmvec``) and the
prelude declares its functions SIMD-callable (``-DFC_LIBMVEC``), so loops over exp, tanh, erf...
vectorise; both flags are part of the cache key.
"""

from __future__ import annotations

import functools
import os
import platform
from dataclasses import dataclass, field

from fireclay_loops.cache_dirs import default_root

# -fno-trapping-math: no code reads floating-point exception flags, and without it GCC will not
# turn a select whose arm divides (a mean's gradient masked by max pooling's) into a vector
# blend, so the whole loop stays scalar; results are the same bits either way.
DEFAULT_FLAGS = ("-O3", "-march=native", "-fopenmp", "-shared", "-fPIC", "-std=c++17", "-fno-math-errno",
                 "-fno-trapping-math", "-w")
DEFAULT_KEEP_ARENA_BYTES = 4 * 2**20


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
class Config:
    cache_dir: str | None = None  # the cache root; None: fireclay_loops.cache_dirs.default_root() at use
    compiler: str | None = None  # None: FIRECLAY_CXX, CXX, then g++
    extra_flags: list[str] = field(default_factory=list)
    threads: int | None = None
    # A program whose arena of intermediates is at most this many bytes keeps it between calls
    # (None: FIRECLAY_CPP_KEEP_ARENA, else DEFAULT_KEEP_ARENA_BYTES). Small programs spend more
    # time making the arena and its views than in some of their kernels; large ones would hold
    # much memory between calls for a gain that is small next to their run time.
    keep_arena_bytes: int | None = None

    def resolved_cache_root(self) -> str:
        """The cache shared with the other stages; this package's files go in its ``cpp/``."""
        return os.path.abspath(self.cache_dir) if self.cache_dir else default_root()

    def resolved_cache_dir(self) -> str:
        return os.path.join(self.resolved_cache_root(), "cpp")

    def resolved_compiler(self) -> str:
        return self.compiler or os.environ.get("FIRECLAY_CXX") or os.environ.get("CXX") or "g++"

    def flags(self) -> list[str]:
        vector_math = ["-DFC_LIBMVEC"] if _has_libmvec() else []
        return (list(DEFAULT_FLAGS) + vector_math + list(self.extra_flags)
                + os.environ.get("FIRECLAY_CPP_FLAGS", "").split())

    def link_flags(self) -> list[str]:
        """Libraries to link, after the source (the linker drops a library named before its users)."""
        return ["-lmvec"] if _has_libmvec() else []

    def resolved_keep_arena_bytes(self) -> int:
        if self.keep_arena_bytes is not None:
            return self.keep_arena_bytes
        env = os.environ.get("FIRECLAY_CPP_KEEP_ARENA")
        return int(env) if env else DEFAULT_KEEP_ARENA_BYTES

    def resolved_threads(self) -> int:
        env = os.environ.get("FIRECLAY_CPP_THREADS")
        return self.threads or (int(env) if env else (os.cpu_count() or 1))


config = Config()
