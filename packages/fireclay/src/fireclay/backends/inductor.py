"""The ``inductor`` backend: our capture, torch's Inductor as the code generator.

Deliberately hands the captured graph (converted to torch.fx) to ``torch._inductor``, so that
our capture can be measured against TorchDynamo on the same work, and Inductor's code generation
against ours on the same graphs.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from fireclay_ir import Program, to_fx


def inductor(program: Program, example_inputs: list) -> Callable[..., Any]:
    from torch._inductor.compile_fx import compile_fx

    gm = to_fx(program)
    compiled = compile_fx(gm, list(example_inputs))

    def run(*inputs: Any) -> Any:
        return compiled(*inputs)

    return run
