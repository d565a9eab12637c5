"""The base of fireclay's dispatch modes."""

from __future__ import annotations

from torch.utils._python_dispatch import TorchDispatchMode


class CompilerDispatchMode(TorchDispatchMode):
    """A ``TorchDispatchMode`` that runs inside the compiler only.

    torch wraps a mode's ``__torch_dispatch__`` so that TorchDynamo never traces into it, and
    that wrapper imports ``torch._dynamo`` the first time any such mode dispatches an op: about a
    second of a fresh process's first compile, on every model. fireclay's modes (fake tensors,
    the meta-kernel cache, the aten tracer) run in compiler stages that TorchDynamo never traces
    (with ``torch.compile(backend="fireclay")`` they run inside the backend, outside the trace),
    so they opt out of the wrapper."""

    @classmethod
    def _should_skip_dynamo(cls) -> bool:
        return False
