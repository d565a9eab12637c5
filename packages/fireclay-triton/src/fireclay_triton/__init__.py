"""fireclay-triton: Triton code generation."""

__version__ = "0.1.0"

from fireclay_ir import require_sibling

require_sibling("fireclay-triton", __version__, "fireclay_ir", "fireclay-ir")
require_sibling("fireclay-triton", __version__, "fireclay_loops", "fireclay-loops")
