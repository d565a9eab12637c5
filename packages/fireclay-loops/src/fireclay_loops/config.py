"""fireclay-loops settings, one typed object; each field can come from an environment variable.

=================================  ============================================  =======
variable                           meaning                                       default
=================================  ============================================  =======
``FIRECLAY_LOOPS_FUSION``          fuse loop nodes into kernels (0 turns off)    1
``FIRECLAY_LOOPS_FUSION_ROUNDS``   most rounds of greedy fusion                  16
``FIRECLAY_LOOPS_PERMUTE_RANK``    highest rank whose loop orders are tried      5
``FIRECLAY_LOOPS_INLINE_OPS``      longest producer body recomputed in consumers 24
``FIRECLAY_LOOPS_VERIFY``          verify every schedule (0 skips the check)     1
``FIRECLAY_LOOPS_MERGE_LOOPS``     merge a kernel's adjacent loops that every    1
                                   index walks as one (0 keeps the tensors'
                                   loops; :mod:`fireclay_loops.merge_loops`)
``FIRECLAY_LOOPS_CHANNELS_LAST``   device types (comma-separated; ``none``)      cpu,cuda
                                   whose programs with 2-D convolutions keep
                                   4-D activations channels-last
``FIRECLAY_LOOPS_UNFUSE_ADDMM``    device types whose ``addmm`` becomes ``mm``   cuda
                                   plus a bias our kernels fuse, when only our
                                   kernels read it (:mod:`.lowering.matmul`)
``FIRECLAY_LOOPS_SPLIT_REDUCE``    device types whose schedules keep            cuda
                                   reductions with few outputs splittable over
                                   programs (:mod:`.long_reductions`)
``FIRECLAY_LOOPS_KERNEL_CHECKS``   check in generated kernels what eager         1
                                   raises on: indices read from tensors
                                   (gather, index_select, embedding, ``x[idx]``)
                                   within their dimension, and integer ``//``,
                                   ``%``, ``fmod``, ``div(rounding_mode=)`` by
                                   zero on the CPU (0 turns the checks off)
=================================  ============================================  =======

``kernel_checks``: with the checks on, an out-of-range index raises
:class:`~fireclay_loops.errors.IndexOutOfBounds` (an ``IndexError`` and a ``RuntimeError``: eager
raises one or the other depending on the op) and an integer division by zero on the CPU raises
:class:`~fireclay_loops.errors.IntegerDivisionByZero` (a ``RuntimeError`` whose message starts
``ZeroDivisionError``, as eager's); fireclay-cpp raises once the kernel returns, fireclay-triton
asserts on the device (``tl.device_assert``, as eager's CUDA kernels do; CUDA's integer division
by zero does not raise in eager, so it is not checked there). With the checks off, such an
index reads whatever memory it points at (or crashes the process) and a division by zero gives 0:
turn them off only for inputs you trust. What they cost is measured in docs/status.md.

``channels_last`` names device types, not devices: ``cpu``, ``cuda``. On the CPU, oneDNN runs
convolutions on channels-last tensors without reordering them on every call, and on CUDA cuDNN
runs its NHWC kernels, so the layout around convolutions is channels-last by default on both (see
:mod:`fireclay_loops.layout`). Measured on an H100 (the benchmarks' cnn_bn, preset large): inference
2.48x of eager channels-last (Inductor 1.75x); training 1.86x once batch norm's per-channel
reductions were split over programs (``split_reductions``), 0.40x before that. Float32 precision
on CUDA: under torch's default ``torch.backends.cudnn.allow_tf32 = True``, cuDNN picks TF32 kernels
for NHWC convolutions where eager's NCHW calls often do not (a BatchNorm network's float32
gradients moved by up to 5e-2 relative at small sizes; with TF32 off they match eager to 1e-6).
Set ``allow_tf32 = False`` for float32-exact convolutions, or leave ``cuda`` out of this knob.
"""

from __future__ import annotations

import os
from dataclasses import dataclass


def _env_devices(name: str, default: tuple[str, ...]) -> tuple[str, ...]:
    raw = os.environ.get(name)
    if raw is None:
        return default
    names = tuple(d.strip().lower() for d in raw.split(",") if d.strip())
    return () if names in ((), ("none",), ("0",)) else names


def _env_int(name: str, default: int) -> int:
    raw = os.environ.get(name)
    if raw is None or raw == "":
        return default
    try:
        return int(raw)
    except ValueError:
        raise ValueError(f"environment variable {name}={raw!r} must be an integer") from None


@dataclass
class Config:
    fusion: bool = True
    max_fusion_rounds: int = 16
    max_permutation_rank: int = 5
    max_inline_ops: int = 24
    verify: bool = True
    merge_loops: bool = True
    channels_last: tuple[str, ...] = ("cpu", "cuda")
    unfuse_addmm_bias: tuple[str, ...] = ("cuda",)
    split_reductions: tuple[str, ...] = ("cuda",)
    kernel_checks: bool = True

    @classmethod
    def from_env(cls) -> Config:
        return cls(
            fusion=bool(_env_int("FIRECLAY_LOOPS_FUSION", 1)),
            max_fusion_rounds=_env_int("FIRECLAY_LOOPS_FUSION_ROUNDS", 16),
            max_permutation_rank=_env_int("FIRECLAY_LOOPS_PERMUTE_RANK", 5),
            max_inline_ops=_env_int("FIRECLAY_LOOPS_INLINE_OPS", 24),
            verify=bool(_env_int("FIRECLAY_LOOPS_VERIFY", 1)),
            merge_loops=bool(_env_int("FIRECLAY_LOOPS_MERGE_LOOPS", 1)),
            channels_last=_env_devices("FIRECLAY_LOOPS_CHANNELS_LAST", ("cpu", "cuda")),
            unfuse_addmm_bias=_env_devices("FIRECLAY_LOOPS_UNFUSE_ADDMM", ("cuda",)),
            split_reductions=_env_devices("FIRECLAY_LOOPS_SPLIT_REDUCE", ("cuda",)),
            kernel_checks=bool(_env_int("FIRECLAY_LOOPS_KERNEL_CHECKS", 1)),
        )


config = Config.from_env()
