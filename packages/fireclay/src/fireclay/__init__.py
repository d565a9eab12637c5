"""fireclay: A graph-mode compiler for PyTorch, built from separable stages."""

__version__ = "0.1.0"

from fireclay_ir import require_sibling

require_sibling("fireclay", __version__, "fireclay_ir", "fireclay-ir")
require_sibling("fireclay", __version__, "fireclay_shapes", "fireclay-shapes")
require_sibling("fireclay", __version__, "fireclay_capture", "fireclay-capture")
require_sibling("fireclay", __version__, "fireclay_autograd", "fireclay-autograd")
require_sibling("fireclay", __version__, "fireclay_loops", "fireclay-loops")
require_sibling("fireclay", __version__, "fireclay_cpp", "fireclay-cpp")
require_sibling("fireclay", __version__, "fireclay_triton", "fireclay-triton")
