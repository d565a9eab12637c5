"""Torch function modes (``torch.overrides.TorchFunctionMode``) entered inside captured code.

A mode changes what every torch call in its ``with`` block does, so the capture enters one only
when it knows that change and reproduces it in the graph; any other mode stays a graph break.
Known today:

- ``TransformGetItemToIndex`` (torch's, used by transformers' vmapped mask functions): inside
  its block ``t[i, j]`` whose index items are all tensors or ints is ``aten.index(t, [i, j])``
  with the ints made 0-d int64 tensors, instead of Python indexing (which turns a 0-d index
  tensor into a number with ``.item()``, something ``torch.vmap`` cannot do on a batched index).
  Recognised by its module and name: the capture does not import the module that defines it.
"""

from __future__ import annotations

from typing import Any

import torch

from fireclay_capture.errors import Unsupported
from fireclay_capture.variables.base import ConstVar, Var, const
from fireclay_capture.variables.containers import ListVar, TupleVar
from fireclay_capture.variables.tensor import INDEX_MODE, TensorVar, record_call

# (module, qualified name) of each mode class -> the name the trace keeps while it is entered.
KNOWN_MODES: dict[tuple[str, str], str] = {
    ("torch._dynamo._trace_wrapped_higher_order_op", "TransformGetItemToIndex"): INDEX_MODE,  # baseline-ok: a name compared, never imported
}


def known_function_mode(value: Any) -> str | None:
    """The trace's name for ``value`` when it is a torch function mode class the trace models."""
    if not isinstance(value, type) or not issubclass(value, torch.overrides.TorchFunctionMode):
        return None
    return KNOWN_MODES.get((value.__module__, value.__qualname__))


class FunctionModeClassVar(Var):
    """A known mode class: calling it (with no arguments) makes the mode."""

    def __init__(self, cls: type, mode: str, source=None):
        self.cls, self.mode, self.source = cls, mode, source

    def python_type(self):
        return type(self.cls)

    def identity(self):
        return self.cls

    def call(self, tx, args, kwargs):
        if args or kwargs:
            raise Unsupported(f"{self.cls.__qualname__}() called with arguments")
        return FunctionModeVar(self.cls, self.mode)

    def __repr__(self):
        return f"mode class {self.cls.__qualname__}"

    def reconstruct(self, specs):
        return specs.output(self) if self.source is not None else ("const", self.cls)


class FunctionModeVar(Var):
    """A known mode made in the trace; ``with`` on it switches the trace's behaviour for the block.
    A graph break inside the block cannot resume there: the mode would have to be entered for
    real between the graphs (so that frame runs eagerly, with a warning)."""

    def __init__(self, cls: type, mode: str):
        self.cls, self.mode = cls, mode

    def python_type(self):
        return self.cls

    def enter(self, tx) -> Var:
        tx.function_modes.append(self.mode)
        return self

    def exit(self, tx) -> None:
        modes = tx.function_modes
        for i in range(len(modes) - 1, -1, -1):
            if modes[i] == self.mode:
                del modes[i]
                return

    def __repr__(self):
        return f"mode {self.cls.__qualname__}()"


def _index_leaves(key: Var) -> list[TensorVar | ConstVar] | None:
    """The leaves of an index as torch's pytree sees them (None has no leaves): tensors and int
    constants; None when the index holds something other than tensors, ints, tuples, lists and
    None."""
    if isinstance(key, (TupleVar, ListVar)):
        leaves: list[TensorVar | ConstVar] = []
        for item in key.items:
            sub = _index_leaves(item)
            if sub is None:
                return None
            leaves.extend(sub)
        return leaves
    if isinstance(key, TensorVar):
        return [key]
    if isinstance(key, ConstVar) and key.value is None:
        return []
    if isinstance(key, ConstVar) and isinstance(key.value, int):
        return [key]
    return None


def _has_none(key: Var) -> bool:
    if isinstance(key, (TupleVar, ListVar)):
        return any(_has_none(i) for i in key.items)
    return isinstance(key, ConstVar) and key.value is None


def getitem_as_index(tx, tensor: TensorVar, key: Var, *, scalar_indices_only: bool = False) -> Var | None:
    """``tensor[key]`` as ``TransformGetItemToIndex`` runs it: ``aten.index`` when every index
    leaf is a tensor or an int; None when the mode leaves the indexing to Python.
    ``scalar_indices_only``: only when the index is ints and 0-d integer tensors (at least one),
    where indexing and selecting by the indices' values agree."""
    from fireclay_capture.variables.torch_names import op_name_of_overload

    leaves = _index_leaves(key)
    if leaves is None:
        return None
    if scalar_indices_only:
        if isinstance(key, ListVar) or isinstance(key, TupleVar) and any(
                isinstance(i, (TupleVar, ListVar)) for i in key.items):
            return None  # a list index is one index tensor, not one index per dim
        tensors = [leaf for leaf in leaves if isinstance(leaf, TensorVar)]
        if not tensors or _has_none(key) or any(
                t.fake.dim() != 0 or t.fake.dtype.is_floating_point or t.fake.dtype.is_complex
                or t.fake.dtype in (torch.bool, torch.uint8) for t in tensors):
            return None
    indices: list[Var] = []
    for leaf in leaves:
        if isinstance(leaf, TensorVar):
            indices.append(leaf)
        else:
            indices.append(record_call(tx, "torch.tensor", torch.tensor, [const(int(leaf.value))],
                                       {"dtype": const(torch.int64), "device": const(torch.device(tensor.device))}))
    op = torch.ops.aten.index.Tensor
    return record_call(tx, op_name_of_overload(op), op, [tensor, ListVar(indices)], {})
