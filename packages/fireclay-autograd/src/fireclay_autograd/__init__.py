"""fireclay-autograd: ATen-level graphs, functionalization, joint graphs, partitioning."""

__version__ = "0.1.0"

from fireclay_ir import require_sibling

require_sibling("fireclay-autograd", __version__, "fireclay_ir", "fireclay-ir")
require_sibling("fireclay-autograd", __version__, "fireclay_shapes", "fireclay-shapes")
