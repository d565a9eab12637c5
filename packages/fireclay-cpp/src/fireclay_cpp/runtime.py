"""What a generated wrapper runs with: tensor helpers, ctypes bindings, and the compiled program."""

from __future__ import annotations

import ctypes
from collections.abc import Callable
from typing import Any

import torch

from fireclay_cpp.errors import CppBackendError
from fireclay_loops.runtime_support import CompiledCall, input_base
from fireclay_loops.runtime_support import aten_op as shared_aten_op
from fireclay_loops.runtime_support import conform as conform  # re-exported for the wrapper
from fireclay_loops.runtime_support import view as view


class InputError(CppBackendError, TypeError):
    """A compiled program was called with inputs unlike those it was compiled for."""


def as_base(t: Any, name: str, dtype: torch.dtype, size: tuple, stride: tuple, offset: int,
            storage_numel: int) -> torch.Tensor:
    """The input as a base tensor whose ``data_ptr()`` is index 0 of the buffer's layout (a copy
    when its strides or offset differ from the compiled ones); a CPU tensor, or InputError."""
    return input_base(t, name, dtype, size, stride, offset, storage_numel, InputError, "cpu")


def typed(mem: torch.Tensor, dtype: torch.dtype, nbytes: int) -> torch.Tensor:
    """A buffer of ``dtype`` in the first ``nbytes`` of a byte allocation."""
    return mem[:nbytes].view(dtype)


def aten_op(name: str) -> Callable:
    return shared_aten_op(name, CppBackendError)


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


class CompiledProgram(CompiledCall):
    """A scheduled program compiled to C++: call it with tensors, get a tuple of tensors.

    ``wrapper_source`` and ``cpp_sources`` are the generated text; ``dump(folder)`` writes them
    (``wrapper.py``, ``schedule.txt``, ``kernels<N>.cpp``) for reading. ``libraries`` tells where
    each library came from (cache or compiler) and how long it took to build.
    """

    input_error = InputError

    def __init__(self, scheduled, wrapper_source: str, cpp_sources: list[str], libraries: list,
                 call: Callable[..., tuple]):
        super().__init__(scheduled, wrapper_source, call)
        self.cpp_sources = cpp_sources
        self.libraries = libraries

    @property
    def cache_hit(self) -> bool:
        return all(lib.cached for lib in self.libraries)

    def source_files(self) -> dict[str, str]:
        files = super().source_files()
        for i, src in enumerate(self.cpp_sources):
            files[f"kernels{i}.cpp"] = src
        return files
