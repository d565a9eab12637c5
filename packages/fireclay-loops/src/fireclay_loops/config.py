"""fireclay-loops settings, one typed object; each field can come from an environment variable.

=================================  ============================================  =======
variable                           meaning                                       default
=================================  ============================================  =======
``FIRECLAY_LOOPS_FUSION``          fuse loop nodes into kernels (0 turns off)    1
``FIRECLAY_LOOPS_FUSION_ROUNDS``   most rounds of greedy fusion                  16
``FIRECLAY_LOOPS_PERMUTE_RANK``    highest rank whose loop orders are tried      5
``FIRECLAY_LOOPS_INLINE_OPS``      longest producer body recomputed in consumers 24
``FIRECLAY_LOOPS_VERIFY``          verify every schedule (0 skips the check)     1
=================================  ============================================  =======
"""

from __future__ import annotations

import os
from dataclasses import dataclass


def _env_int(name: str, default: int) -> int:
    raw = os.environ.get(name)
    if raw is None or raw == "":
        return default
    try:
        return int(raw)
    except ValueError:
        raise ValueError(f"environment variable {name}={raw!r} must be an integer") from None


@dataclass
class Config:
    fusion: bool = True
    max_fusion_rounds: int = 16
    max_permutation_rank: int = 5
    max_inline_ops: int = 24
    verify: bool = True

    @classmethod
    def from_env(cls) -> Config:
        return cls(
            fusion=bool(_env_int("FIRECLAY_LOOPS_FUSION", 1)),
            max_fusion_rounds=_env_int("FIRECLAY_LOOPS_FUSION_ROUNDS", 16),
            max_permutation_rank=_env_int("FIRECLAY_LOOPS_PERMUTE_RANK", 5),
            max_inline_ops=_env_int("FIRECLAY_LOOPS_INLINE_OPS", 24),
            verify=bool(_env_int("FIRECLAY_LOOPS_VERIFY", 1)),
        )


config = Config.from_env()
