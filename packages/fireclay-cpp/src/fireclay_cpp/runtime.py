"""What a generated wrapper runs with: tensor helpers, ctypes bindings, and the compiled program."""

from __future__ import annotations

import ctypes
import threading
from collections.abc import Callable
from typing import Any

import torch

from fireclay_cpp.errors import CppBackendError
from fireclay_ir.dialects import is_custom_op
from fireclay_loops.backend.runtime import CompiledCall, bound_op, input_base
from fireclay_loops.backend.runtime import aten_op as shared_aten_op
from fireclay_loops.backend.runtime import conform as conform  # re-exported for the wrapper
from fireclay_loops.backend.runtime import returns_one_tensor as returns_one_tensor  # re-exported
from fireclay_loops.backend.runtime import view as view


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
    if name in _OUT_COPIES or is_custom_op(name):  # a custom operator's out= form is not known to be one
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
    binding = bound_op(name)
    if binding is not None:  # its out= keyword selects the out overload
        return binding
    namespace, rest = name.split("::", 1)
    return getattr(getattr(torch.ops, namespace), rest.partition(".")[0]).out


def extern_op(name: str) -> Callable:
    """What a wrapper calls for the aten op ``name``: torch's own Python function where it is
    known to take the same arguments and select this overload (a direct call, 2-5 µs cheaper
    than an operator overload's boxed call, which counts in programs of small matmuls), else
    the overload itself."""
    return bound_op(name) or aten_op(name)


def may_alias_argument(name: str) -> bool:
    """Whether a result of the aten op ``name`` may share memory with an argument: its schema
    annotates a return as an alias (``Tensor(a)``, a view); an op unknown here may."""
    try:
        returns = aten_op(name)._schema.returns
    except (CppBackendError, AttributeError):
        return True
    return any(r.alias_info is not None for r in returns)


_LINEAR_OUT: list[Callable | None] = []  # the answer of linear_out(), once known


def linear_out() -> Callable | None:
    """``torch.nn.functional.linear`` when it takes ``out=`` and gives what ``addmm(bias, x,
    w.t())`` and ``mm(x, w.t())`` give, bit for bit (it makes the transposed view in C++, where
    a wrapper would make a Python tensor per call); else None. Decided once per process by
    trying it; a try that fails (under a tensor mode that cannot compare values) decides nothing."""
    if _LINEAR_OUT:
        return _LINEAR_OUT[0]
    linear = torch.nn.functional.linear
    try:
        x, w, b = (torch.arange(n, dtype=torch.float32).reshape(shape).sin()
                   for n, shape in ((6, (2, 3)), (12, (4, 3)), (4, (4,))))
        got, got_mm = torch.empty(2, 4), torch.empty(2, 4)
        linear(x, w, b, out=got)
        linear(x, w, None, out=got_mm)
        same = torch.equal(got, torch.addmm(b, x, w.t())) and torch.equal(got_mm, torch.mm(x, w.t()))
    except (TypeError, RuntimeError):
        return None
    _LINEAR_OUT.append(linear if same else None)
    return _LINEAR_OUT[0]


class ArenaStore:
    """Arena memory kept between calls for the programs that do not keep a workspace of their
    own (an arena over ``Config.keep_arena_bytes``): one block, the largest given back, which
    any such program takes when it is large enough.

    A new arena every call is memory the C library may hand back to the system at the end of the
    call and take again, zeroed, page by page at the next: one page fault per 4 KiB. With glibc's
    default thresholds that was 3,000 faults and a fifth of an EfficientNet-B0 call (batch 4,
    128 px: a 6 MiB arena).
    One block bounds what is held to the largest arena rather than the sum over programs (a
    training step's forward and backward take turns). A program whose output shares the arena
    (an extern op's view of it) does not give it back."""

    ALIGN = 64  # bytes: a block is a whole number of cache lines, so every dtype's view of it fits

    def __init__(self) -> None:
        self._block: torch.Tensor | None = None
        self._lock = threading.Lock()

    def take(self, nbytes: int) -> torch.Tensor:
        """A uint8 tensor of at least ``nbytes`` (the kept block, or a new one), the caller's
        until it gives it back. Made outside inference mode, like a kept workspace: calls in
        either mode may write into it."""
        with self._lock:
            block, self._block = self._block, None
        if block is None or block.numel() < nbytes:
            with torch.inference_mode(False):
                block = torch.empty(-(-nbytes // self.ALIGN) * self.ALIGN, dtype=torch.uint8)
        return block

    def give(self, block: torch.Tensor) -> None:
        """Keep ``block`` for the next call, unless the store holds a larger one."""
        with self._lock:
            if self._block is None or self._block.numel() < block.numel():
                self._block = block

    def clear(self) -> None:
        """Drop the kept block (its memory goes back to the allocator)."""
        with self._lock:
            self._block = None

    @property
    def held_bytes(self) -> int:
        block = self._block
        return 0 if block is None else block.numel()


arena_store = ArenaStore()  # the process's: programs of every compile share it


def bind_run(lib: ctypes.CDLL, name: str, checks: bool = False) -> Callable:
    """A run's entry; one whose kernels check returns nonzero when a check failed."""
    fn = getattr(lib, name)
    fn.argtypes = [ctypes.c_void_p]
    fn.restype = ctypes.c_int if checks else None
    return fn


def raise_check_failure(args: Any, at: int, sites: tuple) -> None:
    """Raise what a run's failed check means: ``args[at:at + 4]`` is the run's error slot (the
    kernel's position in the run, its check's number + 1, the value and the bound seen);
    ``sites[position][number]`` the CheckSite."""
    position, number, value, bound = args[at], args[at + 1] - 1, args[at + 2], args[at + 3]
    raise sites[position][number].error(value, bound)


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
