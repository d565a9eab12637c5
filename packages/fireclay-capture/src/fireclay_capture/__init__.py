"""fireclay-capture: Bytecode-level frame capture of PyTorch programs."""

__version__ = "0.1.0"

from fireclay_ir import require_sibling

require_sibling("fireclay-capture", __version__, "fireclay_ir", "fireclay-ir")
require_sibling("fireclay-capture", __version__, "fireclay_shapes", "fireclay-shapes")
