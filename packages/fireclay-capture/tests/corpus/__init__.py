"""The conformance corpus: small functions and modules, each a :class:`Case`.

Every case runs captured (backend ``eager``) on fresh random inputs several times and must
match eager PyTorch, with the number of graphs, recompiles and eager fallbacks it declares.
Backend authors can reuse the corpus: ``corpus.all_cases()``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch


@dataclass
class Case:
    name: str
    fn: Callable[..., Any]
    inputs: Callable[[], tuple]  # fresh positional arguments for one call
    graphs: int = 1  # captures expected over all calls
    recompiles: int = 0
    fallbacks: int = 0  # calls whose frame is expected to run eagerly
    breaks: int = 0  # captures of the function itself that end in a graph break
    calls: int = 3
    kwargs: Callable[[], dict] = field(default=lambda: {})
    atol: float = 1e-5
    # inputs for the i-th call (to drive recompiles); default: `inputs` every time
    inputs_for_call: Callable[[int], tuple] | None = None


class Registry:
    def __init__(self, group: str):
        self.group = group
        self.cases: list[Case] = []

    def __call__(self, inputs: Callable[[], tuple], **options: Any):
        def register(fn):
            self.cases.append(Case(f"{self.group}.{fn.__name__}", fn, inputs, **options))
            return fn

        return register

    def add(self, name: str, fn, inputs, **options: Any) -> None:
        self.cases.append(Case(f"{self.group}.{name}", fn, inputs, **options))


def T(*shape: int, dtype=torch.float32, requires_grad: bool = False) -> torch.Tensor:
    if dtype.is_floating_point:
        return torch.randn(*shape, dtype=dtype, requires_grad=requires_grad)
    if dtype == torch.bool:
        return torch.rand(*shape) > 0.5
    return torch.randint(-5, 6, shape, dtype=dtype)


def all_cases() -> list[Case]:
    from corpus import (  # noqa: F401
        builtins_cases,
        containers,
        control_flow,
        functions,
        library_helpers,
        modules,
        op_table,
        python_features,
        tensor_ops,
    )

    out: list[Case] = []
    for mod in (tensor_ops, op_table, control_flow, containers, functions, builtins_cases, modules, python_features,
                library_helpers):
        out.extend(mod.CASES.cases)
    return out
