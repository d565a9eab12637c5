"""``torch.compile(model, backend="fireclay")``: TorchDynamo's capture, fireclay's later stages.

Registered through the ``torch_dynamo_backends`` entry point. TorchDynamo hands over a
``torch.fx.GraphModule`` and example inputs; we convert it to a Program with fireclay-ir's fx
interop and run the same pipeline as ``fireclay.compile``'s default backend.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from fireclay.backends import lookup_backend
from fireclay_ir import from_fx


def make_dynamo_backend(name: str) -> Callable[..., Callable[..., Any]]:
    """A TorchDynamo backend ``(gm, example_inputs) -> callable`` running fireclay backend ``name``."""

    def dynamo_backend(gm: Any, example_inputs: list) -> Callable[..., Any]:
        program = from_fx(gm, example_inputs)
        compiled = lookup_backend(name)(program, list(example_inputs))

        def run(*args: Any) -> Any:
            outputs = compiled(*args)
            return tuple(outputs) if isinstance(outputs, list) else outputs

        return run

    dynamo_backend.__name__ = f"fireclay_{name}"
    return dynamo_backend


fireclay = make_dynamo_backend("fireclay")
fireclay_aot_eager = make_dynamo_backend("aot_eager")
