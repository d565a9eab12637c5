"""``torch.compile(model, backend="fireclay")``: TorchDynamo's capture, fireclay's later stages.

Registered through the ``torch_dynamo_backends`` entry point. TorchDynamo hands over a
``torch.fx.GraphModule`` and example inputs; we convert it to a Program with fireclay-ir's fx
interop and run the same pipeline as ``fireclay.compile``'s default backend, under the same
fallback contract (``fireclay.fallback``): a graph that cannot be converted runs as TorchDynamo
captured it, one a stage fails on runs in the interpreter, each with one warning.

``torch.compile(..., mode=...)`` and ``options=...`` reach the backend as keywords and mean what
they mean to ``fireclay.compile`` (``fireclay.list_mode_options``); an unknown mode or option is
an error naming the ones there are.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Callable
from typing import Any

import fireclay as _fireclay_package
from fireclay.api import _with_options
from fireclay.backends import lookup_backend
from fireclay.fallback import guarded_backend
from fireclay.modes import resolve_options
from fireclay_autograd.int_inputs import example_arguments, tensor_inputs_only
from fireclay_ir import from_fx
from fireclay_ir.stages import describe, warn_fallback

_fireclay_package._load_stages()
log = logging.getLogger("fireclay")


def _place(gm: Any) -> str:
    """``file:line`` of the user's code where the graph starts, from TorchDynamo's node metadata."""
    for node in getattr(getattr(gm, "graph", None), "nodes", ()):
        trace = node.meta.get("stack_trace") if hasattr(node, "meta") else None
        match = re.search(r'File "([^"]+)", line (\d+)', trace or "")
        if match:
            return f"{match.group(1)}:{match.group(2)}"
    return "an unknown location"


def make_dynamo_backend(name: str) -> Callable[..., Callable[..., Any]]:
    """A TorchDynamo backend ``(gm, example_inputs, mode=None, options=None) -> callable`` running
    fireclay backend ``name`` with the mode's options."""

    def dynamo_backend(gm: Any, example_inputs: list, mode: str | None = None,
                       options: dict[str, Any] | None = None) -> Callable[..., Any]:
        resolved = resolve_options(mode, options)
        try:
            program = from_fx(gm, example_inputs)
        except Exception as exc:  # the fallback contract: TorchDynamo's graph then runs as captured
            place = _place(gm)
            warn_fallback(log, place, "conversion from torch.fx", (
                f"fireclay: the graph TorchDynamo captured at {place} cannot be converted to fireclay-ir "
                f"({describe(exc)}); it runs as TorchDynamo captured it, without fireclay's stages"))
            return gm.forward
        # With dynamic shapes the graph takes its size symbols (and ints that changed) as ints:
        # they become sizes of tensor inputs, which is how every stage reads symbols.
        ints = tensor_inputs_only(program, example_inputs)
        examples = example_arguments(ints, example_inputs) if ints is not None else list(example_inputs)
        backend = guarded_backend(_with_options(lookup_backend(name), resolved), name, fullgraph=False)
        compiled = backend(program, examples)

        def run(*args: Any) -> Any:
            if ints is not None:
                arguments = ints.arguments(args)
                if arguments is None:  # a negative int has no size carrier: as TorchDynamo captured it
                    return gm.forward(*args)
                args = tuple(arguments)
            outputs = compiled(*args)
            return tuple(outputs) if isinstance(outputs, list) else outputs

        return run

    dynamo_backend.__name__ = f"fireclay_{name}"
    return dynamo_backend


fireclay = make_dynamo_backend("fireclay")
fireclay_aot_eager = make_dynamo_backend("aot_eager")
