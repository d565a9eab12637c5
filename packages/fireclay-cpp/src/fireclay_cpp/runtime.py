"""What a generated wrapper runs with: tensor helpers, ctypes bindings, and the compiled program."""

from __future__ import annotations

import ctypes
import os
from collections.abc import Callable
from typing import Any

import torch

from fireclay_cpp.errors import CppBackendError


class InputError(CppBackendError, TypeError):
    """A compiled program was called with inputs unlike those it was compiled for."""


def as_base(t: Any, name: str, dtype: torch.dtype, size: tuple, stride: tuple, offset: int,
            storage_numel: int) -> torch.Tensor:
    """The input as a base tensor whose ``data_ptr()`` is index 0 of the buffer's layout; a copy
    in that layout when the input's strides or offset differ from the compiled ones."""
    if not isinstance(t, torch.Tensor):
        raise InputError(f"input {name!r} should be a tensor, got {type(t).__name__}")
    if t.dtype != dtype or t.device.type != "cpu" or t.dim() != len(size):
        raise InputError(f"input {name!r} is {t.dtype} {tuple(t.shape)} on {t.device}; the program was compiled for "
                         f"{dtype} {tuple(size)} on cpu: compile again for these inputs")
    if tuple(t.shape) != tuple(size):
        raise InputError(f"input {name!r} has shape {tuple(t.shape)}, the program was compiled for {tuple(size)}")
    same = all(n <= 1 or a == b for n, a, b in zip(size, t.stride(), stride))
    if same and t.storage_offset() >= offset:
        # (a zero-element view would report data_ptr() 0)
        return t if offset == 0 else t.as_strided((1,), (1,), t.storage_offset() - offset)
    flat = torch.empty(storage_numel, dtype=dtype)
    flat.as_strided(size, stride, offset).copy_(t)
    # With no offset the wrapper may use the base itself as the tensor, so it must have the
    # buffer's layout (its data_ptr() is the same).
    return flat.as_strided(size, stride, 0) if offset == 0 else flat


def typed(mem: torch.Tensor, dtype: torch.dtype, nbytes: int) -> torch.Tensor:
    """A buffer of ``dtype`` in the first ``nbytes`` of a byte allocation."""
    return mem[:nbytes].view(dtype)


def view(base: torch.Tensor, size: tuple, stride: tuple, offset: int) -> torch.Tensor:
    return base.as_strided(size, stride, base.storage_offset() + offset)


def conform(t: torch.Tensor, size: tuple, stride: tuple) -> torch.Tensor:
    """An extern call's result with the layout the kernels index it by (copied only if needed)."""
    if tuple(t.shape) == tuple(size) and all(n <= 1 or a == b for n, a, b in zip(size, t.stride(), stride)):
        return t
    return torch.empty_strided(size, stride, dtype=t.dtype).copy_(t)


def aten_op(name: str) -> Callable:
    namespace, rest = name.split("::", 1)
    packet, _, overload = rest.partition(".")
    try:
        return getattr(getattr(getattr(torch.ops, namespace), packet), overload or "default")
    except AttributeError as e:
        raise CppBackendError(f"extern call to {name}: torch {torch.__version__} has no such operator") from e


# Ops whose out= overload computes into a temporary and copies it over: no gain, more memory.
_OUT_COPIES = {"aten::convolution.default"}


def out_argument(name: str) -> str | None:
    """The name of the single ``out=`` argument of ``name``'s ``out`` overload, when it has one
    taking the same arguments and returning one tensor; else None."""
    if name in _OUT_COPIES:
        return None
    try:
        op = aten_op(name)
        packet = getattr(getattr(torch.ops, name.split("::", 1)[0]), op._schema.name.split("::", 1)[1])
        if "out" not in packet.overloads():
            return None
        schema = packet.out._schema
    except (CppBackendError, AttributeError, RuntimeError):
        return None
    outs = [a for a in schema.arguments if a.is_out]
    ins = [a.name for a in schema.arguments if not a.is_out]
    if len(outs) != 1 or len(schema.returns) != 1 or ins != [a.name for a in op._schema.arguments]:
        return None
    return outs[0].name


def out_op(name: str) -> Callable:
    namespace, rest = name.split("::", 1)
    return getattr(getattr(torch.ops, namespace), rest.partition(".")[0]).out


def bind_run(lib: ctypes.CDLL, name: str) -> Callable:
    fn = getattr(lib, name)
    fn.argtypes = [ctypes.c_void_p]
    fn.restype = None
    return fn


def bind_kernel(lib: ctypes.CDLL, name: str, buffers: int, symbols: int) -> Callable:
    fn = getattr(lib, name)
    fn.argtypes = [ctypes.c_void_p] * buffers + [ctypes.c_int64] * symbols
    fn.restype = None
    return fn


class CompiledProgram:
    """A scheduled program compiled to C++: call it with tensors, get a tuple of tensors.

    ``wrapper_source`` and ``cpp_sources`` are the generated text; ``dump(folder)`` writes them
    (with the schedule) for reading. ``libraries`` tells where each library came from (cache or
    compiler) and how long it took to build.
    """

    def __init__(self, scheduled, wrapper_source: str, cpp_sources: list[str], libraries: list,
                 call: Callable[..., tuple]):
        self.scheduled = scheduled
        self.wrapper_source = wrapper_source
        self.cpp_sources = cpp_sources
        self.libraries = libraries
        self._call = call

    @property
    def cache_hit(self) -> bool:
        return all(lib.cached for lib in self.libraries)

    def __call__(self, *inputs: Any) -> tuple:
        if len(inputs) != len(self.scheduled.program.inputs):
            raise InputError(f"the compiled program takes {len(self.scheduled.program.inputs)} inputs, "
                             f"got {len(inputs)}")
        return self._call(*inputs)

    def dump(self, folder: str) -> list[str]:
        """Write ``wrapper.py``, ``kernels<N>.cpp`` and ``schedule.txt`` into ``folder``."""
        os.makedirs(folder, exist_ok=True)
        files = {"wrapper.py": self.wrapper_source, "schedule.txt": str(self.scheduled) + "\n"}
        for i, src in enumerate(self.cpp_sources):
            files[f"kernels{i}.cpp"] = src
        paths = []
        for name, text in files.items():
            path = os.path.join(folder, name)
            with open(path, "w") as f:
                f.write(text)
            paths.append(path)
        return paths
