"""Extern calls: ops a library kernel does better (matmul, convolution, attention) stay calls
into torch's implementation, with their inputs passed as strided views of buffers."""

from __future__ import annotations

from fireclay_loops.lowering.context import fallback
from fireclay_loops.lowering.registry import register_lowering

EXTERN_OPS = (
    "mm.default", "bmm.default", "addmm.default", "baddbmm.default", "addmv.default", "mv.default",
    "convolution.default", "linear.default",
    "scaled_dot_product_attention.default",
    "_scaled_dot_product_flash_attention_for_cpu.default",
    "_scaled_dot_product_efficient_attention.default",
    "_scaled_dot_product_flash_attention.default",
)


def lower_extern(ctx, *args, **kwargs):
    return fallback(ctx, kind="extern")


for _target in EXTERN_OPS:
    register_lowering(_target)(lower_extern)
