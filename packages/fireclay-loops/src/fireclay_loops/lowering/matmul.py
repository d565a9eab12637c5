"""``addmm``: a library matmul, with the bias added where it is cheapest.

``addmm(bias, x, w)`` adds a broadcast bias to ``x @ w``. As one library call the bias is the
library's epilogue; on CUDA, cuBLAS then often picks a slower GEMM than for the plain product
(docs/status.md). When everything that reads the result is computed
by our own kernels (a GELU, a residual add before a layer norm), the program instead calls
``mm`` and adds the bias as a pointwise value, which those kernels fuse: no extra pass over
memory, and the faster GEMM.
"""

from __future__ import annotations

from typing import Any, NamedTuple

from fireclay_ir import iter_values
from fireclay_loops.config import config
from fireclay_loops.lowering.context import LoweringContext, fallback
from fireclay_loops.lowering.pointwise import lower_add
from fireclay_loops.lowering.registry import register_lowering
from fireclay_loops.lowering.values import TensorValue
from fireclay_loops.lowering.views import PURE_VIEW_TARGETS

# A bias added by our kernel for a view a library call reads (q, k and v permuted into attention)
# would be a pass of its own, where the library's epilogue costs nothing: readers are looked for
# through views.


def _kernel_readers_only(graph: Any, value: Any) -> bool:
    """Whether every reader of ``value`` (through views) is an op our kernels compute, and the
    value is no graph output."""
    from fireclay_loops.lowering.driver import lowering_for
    from fireclay_loops.lowering.extern import EXTERN_OPS

    outputs = {id(v) for v in iter_values(graph.outputs)}
    pending, seen = [value], set()
    while pending:
        v = pending.pop()
        if id(v) in outputs:
            return False
        for user in v.users:
            if id(user) in seen:
                continue
            seen.add(id(user))
            target = user.target
            if target in PURE_VIEW_TARGETS:
                pending.extend(o for o in user.outputs if o.is_tensor)
                continue
            if target in EXTERN_OPS or lowering_for(target) is None or target == "addmm.default":
                return False
    return True


def unfuse_bias(ctx: LoweringContext, bias: TensorValue) -> bool:
    """Whether this ``addmm`` lowers to ``mm`` plus a fused bias: its device type is in config
    ``unfuse_addmm_bias`` (CUDA by default), the bias is broadcast along rows, and only our
    kernels read the result."""
    _, _, device = ctx.out_meta()
    if str(device).split(":")[0] not in config.unfuse_addmm_bias:
        return False
    if not isinstance(bias, TensorValue) or len(bias.size) > 1:
        return False
    return _kernel_readers_only(ctx.graph, ctx.node.outputs[0])


class _Call(NamedTuple):
    """An aten call for :func:`fallback` other than the node being lowered (its outputs' types)."""

    op: str
    args: tuple[Any, ...]
    kwargs: dict[str, Any]


@register_lowering("addmm.default")
def lower_addmm(ctx: LoweringContext, bias: TensorValue, x: TensorValue, w: TensorValue, beta: Any = 1,
                alpha: Any = 1) -> Any:
    if beta != 1 or alpha != 1 or not unfuse_bias(ctx, bias):
        return fallback(ctx, kind="extern")
    node = ctx.node
    (product,) = fallback(ctx, _Call("aten::mm.default", (node.args[1], node.args[2]), {}), kind="extern")
    return lower_add(ctx, product, bias)
