"""fireclay-triton's settings, each with its environment variable.

* ``FIRECLAY_CACHE_DIR``: the on-disk cache (default ``$XDG_CACHE_HOME/fireclay`` or
  ``~/.cache/fireclay``, :mod:`fireclay_loops.cache_dirs`; it must be this user's alone);
  generated kernel modules and autotuning results go in its ``triton/`` folder, compiled
  binaries in Triton's own cache (``TRITON_CACHE_DIR``);
* ``FIRECLAY_TRITON_AUTOTUNE``: ``0`` turns autotuning off (the heuristic config is used);
* ``FIRECLAY_TRITON_DUMP``: a folder every compiled program's kernels and wrapper are written to;
* ``FIRECLAY_TRITON_MAX_AUTOTUNE``: ``1`` autotunes every kernel over a larger config set
  (what ``compile_program(..., max_autotune=True)`` asks for one program);
* ``FIRECLAY_TRITON_PERSISTENT_LIMIT``: the longest reduction done in one tile (default 16384:
  on an H200 a 16384-point softmax row ran at 90% of copy bandwidth in one tile, 62% looped);
* ``FIRECLAY_TRITON_PRECOMPILE``: ``0`` leaves every kernel to compile lazily at its first launch
  (default: compiled at ``compile_program`` time, in parallel, ``FIRECLAY_TRITON_COMPILE_THREADS``
  at a time, default the CPU count, in forked processes or threads:
  ``FIRECLAY_TRITON_COMPILE_POOL``, see :func:`fireclay_triton.precompile.pool_kind`);
* ``FIRECLAY_TRITON_DIRECT_LAUNCH``: ``0`` launches every kernel through Triton's
  ``fn[grid](...)`` instead of fireclay's own driver calls (:mod:`fireclay_triton.cuda_launch`);
* ``TRITON_INTERPRET=1`` (Triton's own, read when triton is imported): run kernels on CPU
  tensors in Triton's interpreter; math is then spelt without libdevice.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from fireclay_loops.cache_dirs import default_root


def interpreting() -> bool:
    return os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")


@dataclass
class Config:
    cache_dir: str | None = None  # the cache root; None: fireclay_loops.cache_dirs.default_root() at use
    autotune: bool | None = None  # None: FIRECLAY_TRITON_AUTOTUNE (default on, off when interpreting)
    dump_dir: str | None = None  # None: FIRECLAY_TRITON_DUMP (default: no dump)
    persistent_limit: int | None = None
    max_autotune: bool | None = None  # None: FIRECLAY_TRITON_MAX_AUTOTUNE (default off)
    precompile: bool | None = None  # None: FIRECLAY_TRITON_PRECOMPILE (default on)

    def resolved_cache_root(self) -> str:
        """The cache shared with the other stages; this package's files go in its ``triton/``."""
        return os.path.abspath(self.cache_dir) if self.cache_dir else default_root()

    def resolved_cache_dir(self) -> str:
        return os.path.join(self.resolved_cache_root(), "triton")

    def resolved_autotune(self) -> bool:
        if interpreting():
            return False
        if self.autotune is not None:
            return self.autotune
        return os.environ.get("FIRECLAY_TRITON_AUTOTUNE", "1") != "0"

    def resolved_max_autotune(self) -> bool:
        if interpreting():
            return False
        if self.max_autotune is not None:
            return self.max_autotune
        return os.environ.get("FIRECLAY_TRITON_MAX_AUTOTUNE", "0") not in ("", "0")

    def resolved_precompile(self) -> bool:
        if self.precompile is not None:
            return self.precompile
        return os.environ.get("FIRECLAY_TRITON_PRECOMPILE", "1") != "0"

    def resolved_dump_dir(self) -> str | None:
        return self.dump_dir or os.environ.get("FIRECLAY_TRITON_DUMP") or None

    def resolved_persistent_limit(self) -> int:
        if self.persistent_limit is not None:
            return self.persistent_limit
        return int(os.environ.get("FIRECLAY_TRITON_PERSISTENT_LIMIT", "16384"))


config = Config()
