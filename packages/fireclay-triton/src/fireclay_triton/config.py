"""fireclay-triton's settings section (``fireclay_triton.config``): each field is read from
``FIRECLAY_TRITON_<NAME>`` when the package is imported (:mod:`fireclay_ir.settings`);
docs/settings.md lists them all. A compile may take its own copy
(``compile_program(..., cfg=Config(...))``); the process-wide switches (compile threads and pool,
direct launches) are read from ``fireclay_triton.config``.

Generated kernel modules and autotuning results go in the ``triton/`` folder of the shared cache
root (``fireclay_ir.config.cache_dir``, ``FIRECLAY_CACHE_DIR``; :mod:`fireclay_loops.cache_dirs`),
which must be this user's alone; compiled binaries in Triton's own cache (``TRITON_CACHE_DIR``).
``TRITON_INTERPRET=1`` (Triton's own variable, read when triton is imported) runs kernels on CPU
tensors in Triton's interpreter; math is then spelt without libdevice, and nothing is autotuned.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from fireclay_ir.settings import Settings, setting
from fireclay_loops.cache_dirs import default_root


def interpreting() -> bool:
    return os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")


@dataclass
class Config(Settings, section="triton"):
    autotune: bool = setting(True, "autotune each kernel over a small config set (off: the heuristic config; "
                                   "always off when interpreting)")
    max_autotune: bool = setting(False, "autotune every kernel over a larger config set (what "
                                        "compile_program(..., max_autotune=True) asks for one program)")
    dump_dir: str = setting("", "a folder every compiled program's kernels and wrapper are written to "
                                "(empty: none)")
    # The default comes from softmax rows measured in one tile and looped (docs/status.md).
    persistent_limit: int = setting(16384, "the longest reduction done in one tile")
    precompile: bool = setting(True, "compile every kernel at compile_program time, in parallel (off: each "
                                     "compiles lazily at its first launch)")
    compile_threads: int | None = setting(None, "kernels compiled at a time ahead of their launch (empty: the "
                                                "usable CPU count)")
    compile_pool: str = setting("", "where kernels compile ahead: threads (in this process) or processes "
                                    "(the compile server); empty: processes on 4 or more CPUs that can fork")
    keep_workspace: bool = setting(True, "keep the memory only a call's temporaries use as storages whose views "
                                         "are made once, given their bytes where the memory plan allocates "
                                         "(off: new tensors and views every call)")
    direct_launch: bool = setting(True, "launch kernels through fireclay's own driver calls (off: through "
                                        "Triton's fn[grid](...))")

    def resolved_cache_dir(self) -> str:
        """This package's folder of the cache shared with the other stages."""
        return os.path.join(default_root(), "triton")

    def resolved_autotune(self) -> bool:
        return self.autotune and not interpreting()

    def resolved_max_autotune(self) -> bool:
        return self.max_autotune and not interpreting()


config = Config.from_environment()
