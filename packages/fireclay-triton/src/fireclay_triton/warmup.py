"""Paying a process's one-time Triton costs early, beside the stages that come before code
generation.

The first kernel a fresh process compiles costs far more than the ones after it: importing
Triton's compiler, hashing Triton's own sources for its cache key, asking ptxas its version,
setting up MLIR and LLVM, the first ptxas run, and loading the CUDA driver library (docs/status.md). :func:`prewarm` starts that work as soon as a
caller knows a graph will go to the GPU (the fireclay backend calls it when it receives a graph
with CUDA inputs, before the autograd and loops stages run): it starts the compile server
(:mod:`fireclay_triton.compile_server`), which compiles one tiny kernel for the device's target
in its own process, or, where kernels compile on threads of this process, compiles that kernel on
a daemon thread here. Best effort: a failure here changes nothing, and the real compile meets
the same error and reports it.
"""

from __future__ import annotations

import logging
import threading

import torch
import triton
import triton.language as tl

from fireclay_triton.config import interpreting

log = logging.getLogger("fireclay_triton")

_lock = threading.Lock()
_started: list[threading.Thread] = []


@triton.jit
def first_kernel(ptr0, xnumel, XBLOCK: tl.constexpr):
    xindex = tl.program_id(0) * XBLOCK + tl.arange(0, XBLOCK)
    tl.store(ptr0 + xindex, tl.load(ptr0 + xindex, xindex < xnumel) + 1, xindex < xnumel)


def prewarm(device: int | None = None) -> threading.Thread | None:
    """Start the one-time work of a first Triton compile for CUDA ``device`` (default: the
    current one), once per process, on a daemon thread it returns (None: nothing to do, under the
    interpreter or without a GPU). Where kernels compile in the compile server
    (:func:`fireclay_triton.precompile.pool_kind`), the thread starts that server, which warms up
    in its own process; else it compiles one tiny kernel here."""
    if interpreting() or not torch.cuda.is_available():
        return None
    with _lock:
        if _started:
            return _started[0]
        device = torch.cuda.current_device() if device is None else device
        thread = threading.Thread(target=_work, args=(device,), name="fireclay-triton-prewarm", daemon=True)
        _started.append(thread)
    thread.start()
    return thread


def compile_first_kernel(target) -> None:
    """Compile one tiny kernel for ``target`` in this process: its one-time compiler costs."""
    from triton.runtime.jit import MockTensor

    from fireclay_triton import precompile

    precompile.compile_kernel(first_kernel, [MockTensor(torch.float32), 1024], {"XBLOCK": 128, "num_warps": 4}, target)


def _work(device: int) -> None:
    from fireclay_triton import compile_server, cuda_launch, precompile

    try:
        target = precompile.cuda_target(device)
        if precompile.pool_kind() == "processes":
            compile_server.server(target, precompile.default_workers())
        else:
            compile_first_kernel(target)
        if cuda_launch.enabled():
            cuda_launch.driver()
    except Exception as error:  # the real compile meets it again and reports it
        log.debug("fireclay-triton: warming up the compiler failed: %s: %s", type(error).__name__, error)
