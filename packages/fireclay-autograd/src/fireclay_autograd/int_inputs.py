"""Programs that take Python ints: their ints become symbolic sizes, so every input is a tensor.

TorchDynamo hands a graph with dynamic sizes its size symbols as int inputs (``s77: int``
beside ``x: f32[s77, 8]``), and an int argument of the user's function that changed between
calls as one more int input (``n: int``). This stage traces and compiles graphs of tensors, and
reads symbol values off their shapes, so :func:`tensor_inputs_only` rewrites such a program:

- every use of an int input becomes the symbolic expression of its symbol;
- an int input whose symbol is a dim of a tensor input is dropped (that tensor carries it);
- any other int input becomes a *size carrier*: a ``uint8[s]`` tensor input in its place, whose
  length is the int, made at each call (an empty tensor: no data is written).

:meth:`IntInputs.arguments` turns a call's arguments into the rewritten program's. An int below
zero cannot be a length: it gives None, and the caller runs the graph another way.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from fireclay_ir import Program, ScalarType, SymExpr, TensorMeta

# What happens to an int input: dropped (a tensor's dim holds its symbol) or carried.
DROPPED, CARRIED = "dropped", "carried"


@dataclass
class IntInputs:
    """How to call the rewritten ``program`` with the original program's arguments."""

    program: Program
    # Original input position -> DROPPED or CARRIED, for the int inputs; other inputs pass as given.
    actions: dict[int, str] = field(default_factory=dict)
    device: str = "cpu"

    def arguments(self, args: Sequence[Any]) -> list[Any] | None:
        """The rewritten program's arguments, or None when an int is negative (no carrier for it)."""
        actions = self.actions
        out: list[Any] = []
        for i, x in enumerate(args):
            action = actions.get(i)
            if action is None:
                out.append(x)
            elif action == CARRIED:
                n = int(x)
                if n < 0:
                    return None
                out.append(torch.empty(n, dtype=torch.uint8, device=self.device))
        return out


def _symbol_of(example: Any) -> tuple[str, int] | None:
    """The plain symbol a SymInt example stands for, and its value in this example."""
    node = getattr(example, "node", None)
    expr = str(getattr(node, "expr", ""))
    hint = getattr(node, "hint", None)
    if not expr.isidentifier() or not isinstance(hint, int):
        return None
    return expr, hint


def _fresh_symbol(base: str, taken: set[str]) -> str:
    name, k = f"i_{base}", 1
    while name in taken:
        name, k = f"i_{base}_{k}", k + 1
    return name


def tensor_inputs_only(program: Program, example_inputs: Sequence[Any]) -> IntInputs | None:
    """Rewrite ``program`` (in place) so that it takes tensors only (see the module docstring);
    None when it takes no int input, or one it cannot turn into a size (a negative example, a
    SymInt that is an expression rather than one symbol)."""
    graph = program.main
    ints = [i for i, (v, spec) in enumerate(zip(graph.inputs, graph.input_specs))
            if spec.kind == "user" and isinstance(v.type, ScalarType) and v.type.kind == "int"]
    if not ints or len(example_inputs) != len(graph.inputs):
        return None
    tensor_dims: set[str] = set()
    device = "cpu"
    for v in graph.inputs:
        if v.is_tensor:
            device = v.meta.device
            tensor_dims.update(d for d in v.meta.shape if isinstance(d, str) and d.isidentifier())
    taken = set(program.symbols) | tensor_dims
    symbols: dict[int, tuple[str, int]] = {}
    for i in ints:
        example = example_inputs[i]
        if isinstance(example, torch.SymInt):
            found = _symbol_of(example)
        elif isinstance(example, int) and not isinstance(example, bool):
            # A plain int (a graph not from TorchDynamo): the symbol it is named after, when its
            # tensors use that name, else a symbol of its own.
            name = graph.inputs[i].name
            found = (name if name in tensor_dims else _fresh_symbol(name, taken), example)
            taken.add(found[0])
        else:
            found = None
        if found is None or found[1] < 0:
            return None
        symbols[i] = found
    result = IntInputs(program, device=device)
    for i in sorted(symbols, reverse=True):  # from the back: positions before stay valid
        name, hint = symbols[i]
        value = graph.inputs[i]
        graph.replace_all_uses(value, SymExpr(name))
        if name not in program.symbols:
            program.add_symbol(name, hint=hint)
        if name in tensor_dims:
            del graph.inputs[i], graph.input_specs[i]
            result.actions[i] = DROPPED
        else:
            carrier = graph.add_input(f"size_{name}", TensorMeta("uint8", (name,), device=device))
            graph.inputs.pop()
            spec = graph.input_specs.pop()
            graph.inputs[i], graph.input_specs[i] = carrier, spec
            result.actions[i] = CARRIED
    return result


def example_arguments(ints: IntInputs, example_inputs: Sequence[Any]) -> list[Any]:
    """The rewritten program's example inputs (SymInt examples stand for their hints)."""
    plain = [(_symbol_of(x) or (None, 0))[1] if isinstance(x, torch.SymInt) else x for x in example_inputs]
    args = ints.arguments(plain)
    if args is None:  # pragma: no cover - tensor_inputs_only refuses negative examples
        raise ValueError("a negative int example input")
    return args
