"""fireclay-loops' settings section (``fireclay_loops.config``), one typed object.

The fields, their ``FIRECLAY_LOOPS_*`` variables and defaults are listed in docs/settings.md
(:mod:`fireclay_ir.settings` gives the rule).

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
:mod:`fireclay_loops.layout`; what it gains is measured in docs/status.md). On the CPU a program
stays in eager's layout where its k x k weights, copied channels-last on every call, outweigh the
activations its convolutions read (ResNet at a small batch). On CUDA float32
training keeps eager's layout: under torch's default ``torch.backends.cudnn.allow_tf32 = True``,
cuDNN picks TF32 kernels for NHWC float32 convolutions where eager's NCHW calls often do not (a
BatchNorm network's float32 gradients moved by up to 6e-2 relative); float32 inference and 16-bit
types change layout.

``pad_strides`` names device types too. A buffer our kernels write whose rows are long and not a
multiple of 128 bytes (a language model's logits gradient, ``[tokens, 50257]`` in bf16) is laid out
with its row stride rounded up (:func:`fireclay_loops.layout.padded_strides`): cuBLAS runs its fast
GEMMs only on operands whose rows start 16-byte aligned, and falls back to far slower ``align1``
kernels otherwise. Inputs and the outputs a caller receives keep eager's strides. On the CPU the
library GEMMs take any row stride at the same speed (measured in docs/status.md), so it is off there.
``pad_matmul`` pads the reduction length of such GEMMs with zeros for the same reason
(:mod:`fireclay_loops.lowering.matmul`); an operand our kernels compute in rows that
``pad_strides`` padded is padded in place (its pad columns zeroed, no copy), so the two
settings go together.
"""

from __future__ import annotations

import dataclasses

from fireclay_ir.settings import Settings, setting


@dataclasses.dataclass
class Config(Settings, section="loops"):
    fusion: bool = setting(True, "fuse loop nodes into kernels (off: one kernel per loop node)")
    max_fusion_rounds: int = setting(16, "most rounds of greedy fusion")
    max_permutation_rank: int = setting(5, "highest rank whose loop orders are tried")
    max_inline_ops: int = setting(24, "longest producer body recomputed in its consumers")
    max_lazy_loads: int = setting(32, "most memory loads a lazily computed value (a scatter into a view, a "
                                      "concatenation, a gather) repeats in each consumer before it is stored")
    verify: bool = setting(True, "verify every schedule")
    merge_loops: bool = setting(True, "merge a kernel's adjacent loops that every index walks as one")
    channels_last: tuple[str, ...] = setting(("cpu", "cuda"), "device types whose programs with 2-D "
                                             "convolutions keep 4-D activations channels-last")
    unfuse_addmm_bias: tuple[str, ...] = setting(("cuda",), "device types whose addmm becomes mm plus a bias "
                                                 "our kernels fuse, when only our kernels read it")
    split_reductions: tuple[str, ...] = setting(("cuda",), "device types whose schedules keep reductions "
                                                "with few outputs splittable over programs")
    pad_strides: tuple[str, ...] = setting(("cuda",), "device types whose intermediate buffers with long rows get "
                                           "row strides padded to 128 bytes (aligned library operands)")
    pad_min_stride: int = setting(1024, "shortest stride, in elements, that pad_strides pads")
    pad_matmul: tuple[str, ...] = setting(("cuda",), "device types whose library matmuls with an unaligned "
                                          "reduction length of at least pad_min_stride get it zero-padded")
    unroll_reductions: int = setting(8, "reductions over at most this many points (a static count, at least 2) "
                                         "are computed as pointwise code, each point's value combined in turn")
    kernel_checks: bool = setting(True, "check in generated kernels what eager raises on: indices read from "
                                        "tensors, integer division by zero on the CPU")


config = Config.from_environment()
