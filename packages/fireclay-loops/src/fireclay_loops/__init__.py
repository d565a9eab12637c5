"""fireclay-loops: Lowering to a loop-level IR, scheduling, fusion, memory planning."""

__version__ = "0.1.0"

from fireclay_ir import require_sibling

require_sibling("fireclay-loops", __version__, "fireclay_ir", "fireclay-ir")
require_sibling("fireclay-loops", __version__, "fireclay_shapes", "fireclay-shapes")
