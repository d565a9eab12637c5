"""The adapter that lets TorchDynamo drive this stage: its fx graphs become torch-dialect
Programs through fireclay-ir's fx interop (``torch.compile(model, backend=dynamo_backend())``)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from fireclay_autograd.api import Backend, compile_program


def dynamo_backend(fw_compiler: Backend | None = None, bw_compiler: Backend | None = None, *,
                   partitioner: str = "min_cut") -> Callable[[Any, list[torch.Tensor]], Callable[..., Any]]:
    """A TorchDynamo backend running this stage (and ``fw_compiler``/``bw_compiler``) on the fx
    graphs TorchDynamo captures."""
    from fireclay_ir import from_fx

    def backend(graph_module: Any, example_inputs: list[torch.Tensor]) -> Callable[..., Any]:
        from fireclay_autograd.int_inputs import example_arguments, tensor_inputs_only

        program = from_fx(graph_module, example_inputs)
        # Size symbols and changed ints arrive as int inputs: they become sizes of tensor inputs.
        ints = tensor_inputs_only(program, example_inputs)
        examples = example_arguments(ints, example_inputs) if ints is not None else list(example_inputs)
        compiled = compile_program(program, examples, fw_compiler=fw_compiler, bw_compiler=bw_compiler,
                                   partitioner=partitioner)

        def run(*args: Any) -> Any:
            if ints is not None:
                arguments = ints.arguments(args)
                if arguments is None:  # a negative int has no size carrier: run the graph as captured
                    return graph_module.forward(*args)
                args = tuple(arguments)
            return compiled(*args)

        return run

    return backend
