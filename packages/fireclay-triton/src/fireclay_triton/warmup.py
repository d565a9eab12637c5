"""Paying a process's one-time Triton costs early, beside the stages that come before code
generation.

The first kernel a fresh process compiles costs far more than the ones after it: importing
Triton's compiler, hashing Triton's own sources for its cache key, asking ptxas its version,
setting up MLIR and LLVM, the first ptxas run, and loading the CUDA driver library (0.5-0.9 s on
an H100 host, against 0.04 s for the next kernel). :func:`prewarm` starts that work on a daemon
thread as soon as a caller knows a graph will go to the GPU (the fireclay backend calls it when
it receives a graph with CUDA inputs, before the autograd and loops stages run), by compiling one
tiny kernel for the device's target. Best effort: a failure here changes nothing, and the real
compile meets the same error and reports it.
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
def _first_kernel(ptr0, xnumel, XBLOCK: tl.constexpr):
    xindex = tl.program_id(0) * XBLOCK + tl.arange(0, XBLOCK)
    tl.store(ptr0 + xindex, tl.load(ptr0 + xindex, xindex < xnumel) + 1, xindex < xnumel)


def prewarm(device: int | None = None) -> threading.Thread | None:
    """Start the one-time work of a first Triton compile for CUDA ``device`` (default: the
    current one) on a daemon thread, once per process; returns that thread (None: nothing to do,
    under the interpreter or without a GPU)."""
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


def _work(device: int) -> None:
    from triton.runtime.jit import MockTensor

    from fireclay_triton import cuda_launch, precompile

    try:
        precompile.compile_kernel(_first_kernel, [MockTensor(torch.float32), 1024], {"XBLOCK": 128, "num_warps": 4},
                                  precompile.cuda_target(device))
        if cuda_launch.enabled():
            cuda_launch.driver()
    except Exception as error:  # the real compile meets it again and reports it
        log.debug("fireclay-triton: warming up the compiler failed: %s: %s", type(error).__name__, error)


def wait(timeout: float | None = None) -> None:
    """Block until the warm-up started by :func:`prewarm` (if any) has finished, or ``timeout``
    seconds passed (forked compile workers then inherit a warm compiler)."""
    with _lock:
        thread = _started[0] if _started else None
    if thread is not None and thread.ident is not None:
        thread.join(timeout)
