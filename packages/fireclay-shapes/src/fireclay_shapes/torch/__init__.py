"""fireclay-shapes' torch adapter: fake tensors, and ``torch.SymInt`` backed by our symbols.

* :class:`FakeTensor` / :class:`FakeMode` / :func:`fake_from_real`: tensors without data on the
  meta device that report the real device, run ops through torch's meta kernels, and carry
  symbolic sizes when asked;
* :class:`CachedMetaKernels`: a dispatch mode answering functional ops on plain meta tensors
  from the cache of output types that fakes use too (repeated layers run their meta kernels
  once);
* :class:`CompilerDispatchMode`: the base of the dispatch modes of fireclay's stages;
* :class:`SymbolicNode`, :func:`make_symint`, :func:`expr_of`: torch's SymNode protocol over a
  :class:`fireclay_shapes.ShapeEnv`, so torch's own kernels compute with our symbols and their
  decisions become our guards.

Importing this module imports torch; ``import fireclay_shapes`` alone does not.
"""

try:
    import torch as _torch  # noqa: F401
except ImportError as e:
    raise ImportError("fireclay_shapes.torch is the torch adapter and needs torch installed "
                      "(pip install torch); the rest of fireclay_shapes works without it") from e

from ._dispatch_mode import CompilerDispatchMode
from ._fake import FakeMode, FakeTensor, UnsupportedOpError, fake_from_real
from ._meta_cache import CachedMetaKernels
from ._symnode import SymbolicNode, expr_of, make_symbool, make_symint

__all__ = ["CachedMetaKernels", "CompilerDispatchMode", "FakeMode", "FakeTensor", "SymbolicNode", "UnsupportedOpError", "expr_of",
           "fake_from_real", "make_symbool", "make_symint"]
