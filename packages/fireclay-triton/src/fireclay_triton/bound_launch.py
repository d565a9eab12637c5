"""A kernel's launch bound once for one size: what a generated wrapper calls per launch.

A wrapper launches each kernel as ``kernel3(dev, stream, buf0, buf1, s0)``: the device index and
the stream (read once per call, :func:`launch_target`), the kernel's buffers, then its integer
arguments whose value is not known when the wrapper is generated (size symbols, and the number of
points when it depends on them). Sizes that are constants of the program are not passed.

The first launch goes to the kernel's :class:`~fireclay_triton.runtime.Launcher`, which chooses
the config, finds or compiles the binary and then *binds* the launch: it builds a small function
for exactly that kernel, config, device and set of integer values, and puts it in the wrapper's
namespace under the kernel's name, so the next call of the wrapper calls it directly. Such a
function holds everything that does not change between calls (the grid, the block size, the
constant arguments, already written into the driver's argument slots), checks what might
(the device, each integer argument, each pointer's 16-byte alignment as the binary assumed it)
and on any difference hands the launch back to the launcher, which binds again. Per launch that
leaves: one Python call, one ``data_ptr()`` and one slot write per buffer, one foreign call.

The functions are generated Python text, one per shape of argument list (how many buffers and
integers, which pointers are checked), compiled once per process and closed over each kernel's
values; kernels that the driver call cannot launch alone, split reductions (a workspace and two
launches) and Triton's interpreter get a function that checks the integers and calls the
launcher's own launch at the bound config.
"""

from __future__ import annotations

import ctypes
import threading
from collections.abc import Callable
from typing import Any

import torch

_FACTORIES: dict[str, Callable[..., Callable]] = {}
_FACTORIES_LOCK = threading.Lock()


def _factory(source: str) -> Callable[..., Callable]:
    """The ``make`` function of ``source``, compiled once per process."""
    found = _FACTORIES.get(source)
    if found is None:
        namespace: dict[str, Any] = {}
        exec(compile(source, "<fireclay-triton bound launch>", "exec"), namespace)
        with _FACTORIES_LOCK:
            found = _FACTORIES.setdefault(source, namespace["make"])
    return found


def _int_checks(ints: int) -> list[str]:
    return [f"x_int{i} != v{i}" for i in range(ints)]


def _params(buffers: int, ints: int) -> list[str]:
    return [f"x{i}" for i in range(buffers)] + [f"x_int{i}" for i in range(ints)]


def bind_run(general: Callable, run: Callable, own: int, buffers: int, values: tuple[int, ...]) -> Callable:
    """A launch that calls ``run(own_args)`` while the integer arguments are ``values`` (else
    ``general``, the launcher, with everything). ``own``: how many of the passed arguments are the
    kernel's own (its buffers and symbols; the rest are its sizes, bound into ``run``)."""
    params = _params(buffers, len(values))
    checks = _int_checks(len(values))
    names = ", ".join(params)
    body = [f"        if {' or '.join(checks)}:", f"            return general(dev, stream, {names})"] if checks else []
    own_args = "".join(f"{p}, " for p in params[:own])
    source = "\n".join([
        f"def make(general, run, {''.join(f'v{i}, ' for i in range(len(values)))}):",
        f"    def launch(dev, stream, {names}):",
        *body,
        f"        run(({own_args}))",
        "    return launch",
    ])
    return _factory(source)(general, run, *values)


def bind_driver(general: Callable, kernel: Any, grid: tuple[int, int], device: int, buffers: int,
                values: tuple[int, ...], aligned: tuple[bool, ...], driver: Any) -> Callable:
    """A launch of the loaded ``kernel`` (a :class:`~fireclay_triton.cuda_launch.CudaKernel`) on
    ``grid`` through the driver's ``cuLaunchKernel``, for the first ``buffers`` arguments as
    pointers and integer arguments ``values``; ``aligned``: per buffer, whether the binary was
    specialized for a 16-byte aligned pointer there. The kernel's integer slots must already hold ``values``
    (``CudaKernel.write_constants``)."""
    params = _params(buffers, len(values))
    names = ", ".join(params)
    slots = kernel.pointer_slots(buffers)  # buffer position -> its slot
    checks = ["dev != device", *_int_checks(len(values))]
    lines = [f"        if {' or '.join(checks)}:", f"            return general(dev, stream, {names})"]
    lines += [f"        p{i} = x{i}.data_ptr()" for i in range(buffers) if i in slots]
    # each pointer's alignment as the binary was specialized for: a misaligned one needs another
    # binary, an aligned one where the binary assumed none a faster binary
    alignment = []
    must_align = [f"p{i}" for i in range(buffers) if i in slots and aligned[i]]
    if must_align:
        alignment.append(f"({' | '.join(must_align)}) & 15")
    alignment += [f"not p{i} & 15" for i in range(buffers) if i in slots and not aligned[i]]
    if alignment:
        lines += [f"        if {' or '.join(alignment)}:", f"            return general(dev, stream, {names})"]
    lines += [f"        slot{i}.value = p{i}" for i in range(buffers) if i in slots]
    lines += ["        failed = launch(function, grid_x, grid_y, one, block, one, one, shared, stream, params, None)",
              "        if failed:",
              "            check(failed, what)"]
    slot_names = [f"slot{i}" for i in range(buffers) if i in slots]
    source = "\n".join([
        "def make(general, launch, check, what, function, grid_x, grid_y, one, block, shared, params, device, "
        f"{''.join(f'v{i}, ' for i in range(len(values)))}{''.join(f'{s}, ' for s in slot_names)}):",
        f"    def launch_kernel(dev, stream, {names}):",
        *lines,
        "    return launch_kernel",
    ])
    u = ctypes.c_uint
    return _factory(source)(general, driver.launch_packed, driver.check, f"launching kernel {kernel.name}",
                            kernel.function, u(grid[0]), u(grid[1]), u(1), u(kernel.block), u(kernel.shared),
                            kernel.params, device, *values, *[slots[i] for i in range(buffers) if i in slots])


def bind_split(general: Callable, first: Callable, finish: Callable, size: int, device: Any,
               index: int) -> Callable:
    """A split reduction's launch: a float32 workspace of ``size`` elements on ``device`` (whose
    index is ``index``), then ``first`` and ``finish`` (bound driver launches taking the
    program's buffers and the workspace); on another device, ``general`` (the launcher).

    The workspace is a tensor made once whose storage is given its bytes for the two launches and
    gives them back after (``resize_``: one allocator call each way, where a new tensor costs
    several microseconds per launch); a launch takes it from a pool, so a launch on another
    thread makes its own."""
    nbytes = size * torch.float32.itemsize
    pool: list[tuple[torch.Tensor, Any]] = []

    def launch(dev: int, stream: Any, *buffers: Any) -> None:
        if dev != index:
            return general(dev, stream, *buffers)
        if pool:
            ws, storage = pool.pop()
            storage.resize_(nbytes)
        else:
            ws = torch.empty(size, dtype=torch.float32, device=device)
            storage = ws.untyped_storage()
        first(dev, stream, *buffers, ws)
        finish(dev, stream, *buffers, ws)
        storage.resize_(0)  # freed once the launches are queued, as a tensor going out of scope is
        pool.append((ws, storage))
        return None

    return launch


def stream_value(stream: Any) -> int:
    """A stream as :func:`launch_target` gives it, as the integer handle."""
    return (stream.value or 0) if isinstance(stream, ctypes.c_void_p) else int(stream or 0)
