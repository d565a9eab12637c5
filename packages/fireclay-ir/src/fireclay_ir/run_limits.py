"""Bounds on running a program that came from someone else: steps and bytes.

A document can describe a loop that never ends, a graph that is run again and again through
sub-graphs, an input of 2**33 elements, or one op that allocates a terabyte. The reference
interpreter takes a :class:`RunLimits` (``interpret(program, *args, limits=RunLimits())``) and
stops with a :class:`RunLimitError` before crossing one:

* ``max_steps`` counts every node run and every graph entered (sub-graphs and loop iterations
  included), so an empty loop body still counts;
* ``max_bytes`` bounds the tensors the run holds at once: inputs and weights are checked before
  the run, each node's declared outputs before it runs, and every op torch dispatches is first
  run on the meta device, so an allocation larger than what is left is refused before it is made.

``fireclay run`` uses the defaults. Without limits (the default of ``interpret``) nothing is
checked: a program the caller built or trusts runs at full speed.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from fireclay_ir.model import IRError, TensorMeta

# Bytes per element of each dtype name of the format (sub-byte and unknown dtypes count as one).
_ITEM_BYTES = {"float64": 8, "complex128": 16, "complex64": 8, "int64": 8, "uint64": 8, "float32": 4,
               "int32": 4, "uint32": 4, "float16": 2, "bfloat16": 2, "int16": 2, "uint16": 2, "complex32": 4}


@dataclass(frozen=True)
class RunLimits:
    """Limits of one run of an untrusted program (see the module docstring)."""

    max_steps: int = 1_000_000
    max_bytes: int = 8 * 1024**3

    def check_tensor(self, shape: tuple[int, ...], dtype: str, what: str, held: int = 0) -> int:
        """The bytes of a ``dtype`` tensor of ``shape``; RunLimitError when ``held`` plus them is
        above ``max_bytes``."""
        size = tensor_bytes(shape, dtype)
        if held + size > self.max_bytes:
            raise RunLimitError(f"{what} needs {size} bytes ({dtype}{list(shape)}), and the run may hold "
                                f"{self.max_bytes} bytes at once ({held} already held); "
                                "raise RunLimits.max_bytes to run it")
        return size


class RunLimitError(IRError):
    """A run stopped because it would cross one of its :class:`RunLimits`."""


def tensor_bytes(shape: tuple[int, ...], dtype: str) -> int:
    return math.prod(shape) * _ITEM_BYTES.get(dtype, 1)


def declared_shape(meta: TensorMeta, symbols: dict[str, Any]) -> tuple[int, ...] | None:
    """``meta``'s shape with its symbols evaluated, or None when one cannot be evaluated yet."""
    from fireclay_ir.interpreter import evaluate_symexpr

    dims = []
    for d in meta.shape:
        if isinstance(d, int):
            dims.append(d)
            continue
        try:
            value = evaluate_symexpr(d, symbols)
        except IRError:
            return None
        if not isinstance(value, int) or isinstance(value, bool):
            return None
        dims.append(value)
    return tuple(dims)


def value_bytes(x: Any) -> int:
    """The bytes of the tensors in ``x`` (a tensor, or a tuple/list of them); 0 for other values."""
    if isinstance(x, (list, tuple)):
        return sum(value_bytes(v) for v in x)
    nbytes = getattr(x, "nbytes", None)
    if isinstance(nbytes, int) and hasattr(x, "untyped_storage"):
        return nbytes
    return 0


def allocation_guard(room: Any) -> Any:
    """A torch dispatch mode that runs every op on the meta device first and refuses one whose
    results need more bytes than ``room()`` says are left."""
    import torch
    from torch.utils._python_dispatch import TorchDispatchMode
    from torch.utils._pytree import tree_flatten, tree_map

    def to_meta(x: Any) -> Any:
        return x.to("meta") if isinstance(x, torch.Tensor) and x.device.type != "meta" else x

    class AllocationGuard(TorchDispatchMode):  # type: ignore[misc]  # torch is untyped here
        def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
            kwargs = kwargs or {}
            if all(r.alias_info is not None for r in func._schema.returns):
                return func(*args, **kwargs)  # views and in-place ops allocate nothing
            meta_args, meta_kwargs = tree_map(to_meta, (args, kwargs))
            if "device" in meta_kwargs:
                meta_kwargs["device"] = torch.device("meta")
            try:
                results = func(*meta_args, **meta_kwargs)
            except Exception:  # no meta kernel, or a data-dependent op: its inputs bound it
                results = None
            if results is not None:
                leaves, _ = tree_flatten(results)
                size = sum(t.nelement() * t.element_size() for t in leaves if isinstance(t, torch.Tensor))
                left = room()
                if size > left:
                    raise RunLimitError(f"{func} would allocate {size} bytes; {left} bytes are left under "
                                        "RunLimits.max_bytes")
            return func(*args, **kwargs)

    return AllocationGuard()
