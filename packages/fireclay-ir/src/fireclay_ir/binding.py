"""The values a program's entry graph is called with: the caller's for its user inputs, the
program's own weight data for its parameters, buffers and constants."""

from __future__ import annotations

from typing import Any

from fireclay_ir.model import IRError, Program


def bind_inputs(program: Program, user_values: list[Any], *, error: type[Exception] = IRError,
                hint: str = "load the program with its weights file or pass every input explicitly") -> list[Any]:
    """Every entry-graph input, in order. ``error`` (with ``hint``) is raised for a non-user
    input whose weight the program does not hold; ``user_values`` must be as many as the user
    inputs (callers check and word that themselves)."""
    graph = program.graphs[program.entry]
    given = iter(user_values)
    bound: list[Any] = []
    for v, spec in zip(graph.inputs, graph.input_specs):
        if spec.kind == "user":
            bound.append(next(given))
            continue
        weight = program.weights.get(spec.target or "")
        if weight is None or weight.data is None:
            raise error(f"input %{v.name} is the {spec.kind} {spec.target!r}, but the program holds no data for it; "
                        f"{hint}")
        bound.append(weight.data)
    return bound
