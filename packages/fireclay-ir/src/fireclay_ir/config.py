"""The shared settings section: what every stage reads. Its variables have no section part in
their names (``FIRECLAY_CACHE_DIR``, ``FIRECLAY_VERIFY``; :mod:`fireclay_ir.settings`)."""

from __future__ import annotations

import dataclasses

from fireclay_ir.settings import Settings, setting


@dataclasses.dataclass
class SharedSettings(Settings, section=""):
    cache_dir: str = setting("", "the root of every stage's on-disk cache (empty: $XDG_CACHE_HOME/fireclay, "
                                 "else ~/.cache/fireclay); it must be this user's alone")
    verify: bool = setting(False, "verify every program at each stage boundary (slower; for debugging "
                                  "the compiler)")


config = SharedSettings.from_environment()
