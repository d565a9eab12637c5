"""The base of fireclay's dispatch modes."""

from __future__ import annotations

from torch.utils._python_dispatch import TorchDispatchMode

from fireclay_shapes.torch import _lazy_disable


class CompilerDispatchMode(TorchDispatchMode):
    """A ``TorchDispatchMode`` that runs inside the compiler only.

    torch wraps a mode's ``__torch_dispatch__`` so that its own frame capture never traces into
    it; the wrapper enters that capture's disable context on every dispatched op, a cost paid per
    op while fireclay traces. fireclay's modes (fake tensors, the meta-kernel cache, the aten
    tracer) run only in compiler stages, which that capture never traces (as a registered backend
    they run inside the backend call, outside its trace), so they opt out of the wrapper.

    Entering one the first time also spares torch's Python meta kernels the import of
    TorchDynamo they would otherwise make (:mod:`fireclay_shapes.torch._lazy_disable`)."""

    def __enter__(self):
        _lazy_disable.install()
        return super().__enter__()

    @classmethod
    def _should_skip_dynamo(cls) -> bool:
        return False
