"""Tensor helpers every generated wrapper of a scheduled program runs with, whatever its target:
an input taken as the base tensor of its buffer's layout, strided views of a base, an extern
call's result in the layout the kernels index it by, aten operators by name, and the
compiled program a caller holds.

A buffer is held at run time as a *base* tensor whose ``data_ptr()`` is the buffer's index 0
(the origin of its index expressions); views are ``as_strided`` of the base.

Needs torch (the ``torch`` extra); ``import fireclay_loops`` does not import this module.
"""

from __future__ import annotations

import math
import os
import types
from collections.abc import Callable, Sequence
from typing import Any

import torch

from fireclay_ir import IRError, lookup_op
from fireclay_ir.dialects import is_custom_op


def contiguous_strides(size: Sequence[Any]) -> tuple[int, ...]:
    out: list[int] = []
    step = 1
    for n in reversed(size):
        out.append(step)
        step *= max(int(n), 1)
    return tuple(reversed(out))


def same_strides(size: Sequence[Any], strides: Sequence[Any], expected: Sequence[Any]) -> bool:
    """Whether ``strides`` address a tensor of ``size`` as ``expected`` do (the stride of a
    dimension of extent 0 or 1 never matters)."""
    return all(n <= 1 or a == b for n, a, b in zip(size, strides, expected))


def input_base(t: Any, name: str, dtype: torch.dtype, size: tuple[Any, ...], stride: tuple[Any, ...], offset: int, storage_numel: int,
               error: type[Exception], device_type: str | None = None) -> torch.Tensor:
    """The input as a base tensor whose ``data_ptr()`` is index 0 of the buffer's layout; a copy
    in that layout when the input's strides or offset differ from the compiled ones. An input
    of another dtype, rank or shape (or, given ``device_type``, device) raises ``error``."""
    if not isinstance(t, torch.Tensor):
        raise error(f"input {name!r} should be a tensor, got {type(t).__name__}")
    if t.dtype != dtype or t.dim() != len(size) or (device_type is not None and t.device.type != device_type):
        got, compiled = (f" on {t.device}", f" on {device_type}") if device_type is not None else ("", "")
        raise error(f"input {name!r} is {t.dtype} {tuple(t.shape)}{got}; the program was compiled for "
                    f"{dtype} {tuple(size)}{compiled}: compile again for these inputs")
    if tuple(t.shape) != tuple(size):
        raise error(f"input {name!r} has shape {tuple(t.shape)}, the program was compiled for {tuple(size)}")
    if same_strides(size, t.stride(), stride) and t.storage_offset() >= offset:
        if offset == 0:  # exactly the buffer's layout (strides of extent-1 dims included)
            return t if t.stride() == tuple(stride) else t.as_strided(size, stride, t.storage_offset())
        # (a one-element view, as a zero-element one may report data_ptr() 0)
        return t.as_strided((1,), (1,), t.storage_offset() - offset)
    flat = torch.empty(max(storage_numel, 1), dtype=dtype, device=t.device)
    flat.as_strided(size, stride, offset).copy_(t)
    # With no offset a wrapper may use the base itself as the tensor, so it has the buffer's
    # layout (its data_ptr() is the same).
    return flat.as_strided(size, stride, 0) if offset == 0 else flat


def view(base: torch.Tensor, size: tuple[Any, ...], stride: tuple[Any, ...], offset: int) -> torch.Tensor:
    """The strided view of a buffer held as ``base``, at its index 0 + ``offset``."""
    return base.as_strided(size, stride, base.storage_offset() + offset)


def conform(t: torch.Tensor, size: tuple[Any, ...], stride: tuple[Any, ...]) -> torch.Tensor:
    """An extern call's result with the layout the kernels index it by (copied only if needed)."""
    if tuple(t.shape) == tuple(size) and same_strides(size, t.stride(), stride):
        # exactly that layout, strides of extent-1 dims included: a wrapper may use it as it is
        return t if t.stride() == tuple(stride) else t.as_strided(size, stride, t.storage_offset())
    if t.numel() == math.prod(size) and t.is_contiguous() and same_strides(size, contiguous_strides(size), stride):
        # the same storage declared in another shape (a result the program returns reshaped)
        return t.as_strided(size, stride, t.storage_offset())
    return torch.empty_strided(size, stride, dtype=t.dtype, device=t.device).copy_(t)


def aten_op(name: str, error: type[Exception] = LookupError) -> Any:
    """The torch operator overload named ``namespace::packet[.overload]``; ``error`` when this
    torch has none. A custom operator (``aten::mylib::scale.default``) is the one this process
    registered in the aten dialect, never looked up by name alone."""
    if is_custom_op(name):
        try:
            return lookup_op(name).target()
        except IRError as e:
            raise error(f"extern call to {name}: {e}") from e
    namespace, rest = name.split("::", 1)
    packet, _, overload = rest.partition(".")
    try:
        return getattr(getattr(getattr(torch.ops, namespace), packet), overload or "default")
    except AttributeError as e:
        raise error(f"extern call to {name}: torch {torch.__version__} has no such operator") from e


def returns_one_tensor(name: str) -> bool:
    """Whether the aten op ``name`` returns exactly one tensor (not a tuple or list)."""
    try:
        returns = aten_op(name)._schema.returns
    except (LookupError, AttributeError):
        return False
    return len(returns) == 1 and str(returns[0].type) == "Tensor"


# Ops whose ``torch.<name>`` function takes the overload's arguments (positional and keyword)
# and resolves to it, with ``out=`` to its out overload. Listed, not guessed: a Python function
# of the same name may bind another overload (Scalar forms) or be a Python wrapper.
# ``torch.convolution`` has no ``out=`` (wrappers never ask it for one: its out overload copies).
_BOUND = {"aten::mm.default", "aten::addmm.default", "aten::bmm.default", "aten::baddbmm.default",
          "aten::_scaled_dot_product_flash_attention_for_cpu.default", "aten::convolution.default"}


def bound_op(name: str) -> Callable[..., Any] | None:
    """torch's own (C) function for the aten op ``name`` where it is known to take the same
    arguments and select this overload: a direct call, 2-5 µs cheaper than an operator
    overload's boxed call, which counts in programs of small matmuls or convolutions (a
    MobileNet calls 52). None for other ops."""
    if name not in _BOUND:
        return None
    fn = getattr(torch, name.split("::", 1)[1].partition(".")[0], None)
    return fn if isinstance(fn, types.BuiltinFunctionType) else None


class CompiledCall:
    """A scheduled program compiled for some target: call it with tensors, get a tuple of tensors.
    ``wrapper_source`` is the generated call sequence; ``dump(folder)`` writes it, the
    schedule and the target's sources (``source_files``) for reading."""

    input_error: type[Exception] = TypeError  # a target raises its own

    def __init__(self, scheduled: Any, wrapper_source: str, call: Callable[..., tuple[Any, ...]]):
        self.scheduled = scheduled
        self.wrapper_source = wrapper_source
        self._call = call

    def __call__(self, *inputs: Any) -> tuple[Any, ...]:
        expected = len(self.scheduled.program.inputs)
        if len(inputs) != expected:
            bound = self.bind_weights(inputs)
            if bound is None:
                users = expected - len(self.scheduled.program.input_specs)
                also = f" (or its {users} user inputs: the program binds its weights)" if users != expected else ""
                raise self.input_error(f"the compiled program takes {expected} inputs{also}, got {len(inputs)}")
            return self._call(*bound)
        return self._call(*inputs)

    def bind_weights(self, user_inputs: Sequence[Any]) -> list[Any] | None:
        """Every input, given only the user inputs: parameters, buffers and constants come from
        the program's weights (as the capture convention does). ``None`` when the count does not
        match or a weight has no data. Weights go in detached: a compiled program computes values,
        gradients are the autograd stage's (a weight that requires grad would refuse ``out=``)."""
        program = self.scheduled.program
        specs = program.input_specs
        if not specs or len(user_inputs) != len(program.inputs) - len(specs):
            return None
        given = iter(user_inputs)
        bound = []
        for name in program.inputs:
            spec = specs.get(name)
            if spec is None:
                bound.append(next(given))
                continue
            weight = program.weights.get(spec.target)
            if weight is None or weight.data is None:
                return None
            data = weight.data
            bound.append(data.detach() if isinstance(data, torch.Tensor) else data)
        return bound

    def source_files(self) -> dict[str, str]:
        """File name -> text of what ``dump`` writes."""
        return {"wrapper.py": self.wrapper_source, "schedule.txt": str(self.scheduled) + "\n"}

    def dump(self, folder: str) -> list[str]:
        """Write ``source_files()`` into ``folder``; returns their paths."""
        os.makedirs(folder, exist_ok=True)
        paths = []
        for name, text in self.source_files().items():
            path = os.path.join(folder, name)
            with open(path, "w") as f:
                f.write(text)
            paths.append(path)
        return paths
