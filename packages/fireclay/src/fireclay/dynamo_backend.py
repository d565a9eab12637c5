"""``torch.compile(model, backend="fireclay")``: TorchDynamo's capture, fireclay's later stages.

Registered through the ``torch_dynamo_backends`` entry point. TorchDynamo hands over a
``torch.fx.GraphModule`` and example inputs; we convert it to a Program with fireclay-ir's fx
interop and run the same pipeline as ``fireclay.compile``'s default backend.

``torch.compile(..., mode=...)`` and ``options=...`` reach the backend as keywords and mean what
they mean to ``fireclay.compile`` (``fireclay.list_mode_options``); an unknown mode or option is
an error naming the ones there are.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import fireclay as _fireclay_package
from fireclay.api import _with_options
from fireclay.backends import lookup_backend
from fireclay.modes import resolve_options
from fireclay_ir import from_fx

_fireclay_package._load_stages()


def make_dynamo_backend(name: str) -> Callable[..., Callable[..., Any]]:
    """A TorchDynamo backend ``(gm, example_inputs, mode=None, options=None) -> callable`` running
    fireclay backend ``name`` with the mode's options."""

    def dynamo_backend(gm: Any, example_inputs: list, mode: str | None = None,
                       options: dict[str, Any] | None = None) -> Callable[..., Any]:
        resolved = resolve_options(mode, options)
        program = from_fx(gm, example_inputs)
        compiled = _with_options(lookup_backend(name), resolved)(program, list(example_inputs))

        def run(*args: Any) -> Any:
            outputs = compiled(*args)
            return tuple(outputs) if isinstance(outputs, list) else outputs

        return run

    dynamo_backend.__name__ = f"fireclay_{name}"
    return dynamo_backend


fireclay = make_dynamo_backend("fireclay")
fireclay_aot_eager = make_dynamo_backend("aot_eager")
