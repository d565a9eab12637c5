"""Regenerate fireclay-ir's shipped ATen schema data from the installed torch.

    python packages/fireclay-ir/scripts/gen_aten_schemas.py [--check]

Writes ``src/fireclay_ir/dialects/data/aten_core_v1.json``: every overload tagged
``torch.Tag.core``, the functional overloads of those ops, and the non-core ops listed in
``COMMON_NON_CORE`` (with their in-place variants) that graphs meet before decomposition. The
output is canonical (sorted keys), so regenerating with the same torch gives the same bytes.
``--check`` compares instead of writing (for CI) and fails when the data is stale.

Bump ``VERSION`` (and the file name) when an op's schema changes incompatibly.
"""

from __future__ import annotations

import argparse
import json
import pathlib
import sys

import torch

VERSION = 1
OUT = pathlib.Path(__file__).resolve().parents[1] / "src/fireclay_ir/dialects/data/aten_core_v1.json"

# Op packets (all their non-out overloads) that capture and autograd meet before
# decomposition to the core set: views, in-place variants, conversions, layers, matmuls.
COMMON_NON_CORE = """
    view reshape _unsafe_view alias t transpose permute expand expand_as squeeze unsqueeze
    flatten unflatten select slice narrow split split_with_sizes chunk unbind as_strided
    contiguous clone detach _to_copy to copy_ lift_fresh_copy empty empty_like zeros zeros_like
    ones ones_like full full_like rand rand_like randn randn_like randint arange linspace
    native_layer_norm native_layer_norm_backward layer_norm group_norm native_group_norm
    batch_norm _native_batch_norm_legit_functional convolution conv1d conv2d conv3d
    convolution_backward linear mm addmm bmm baddbmm matmul dot mv addmv einsum
    scaled_dot_product_attention _scaled_dot_product_flash_attention_for_cpu
    _scaled_dot_product_efficient_attention _scaled_dot_product_flash_attention
    embedding embedding_dense_backward dropout native_dropout softmax log_softmax
    _softmax_backward_data _log_softmax_backward_data gelu gelu_backward silu silu_backward
    relu threshold_backward tanh_backward sigmoid_backward mean sum var_mean std_mean
    cat stack where masked_fill masked_fill_ index index_put index_put_ index_select gather
    scatter scatter_add scatter_reduce fill fill_ zero_ add_ sub_ mul_ div_ addcmul addcdiv
    lerp cumsum cumprod topk sort argsort repeat tile roll flip tril triu nll_loss_forward
    nll_loss_backward cross_entropy_loss mse_loss _assert_async _assert_scalar
    sym_size sym_stride sym_numel sym_storage_offset _local_scalar_dense item
    upsample_nearest2d upsample_bilinear2d max_pool2d_with_indices avg_pool2d
    adaptive_avg_pool2d _adaptive_avg_pool2d pad constant_pad_nd new_empty new_zeros new_ones
    new_full new_empty_strided empty_strided bernoulli bernoulli_ normal uniform_ exponential_
    abs_ neg_ relu_ sigmoid_ tanh_ exp_ clamp_ clamp_min_ clamp_max_ pow_ sqrt_ rsqrt_
    masked_scatter logical_not_ bitwise_and_ bitwise_or_ eq_ ne_ lt_ le_ gt_ ge_ copy
    isfinite isinf isnan all any masked_select nonzero silu hardswish hardsigmoid leaky_relu elu
    softplus mish logsumexp norm linalg_vector_norm std var max min amax amin argmax argmin
    prod rsub square erf expm1 log1p log2 square sign round trunc frac floor ceil reciprocal
    clamp_min clamp_max logical_and logical_or logical_xor bitwise_not maximum minimum fmod
    remainder floor_divide one_hot tensor_split repeat_interleave outer diagonal movedim
    swapaxes select_scatter slice_scatter diagonal_scatter as_strided_scatter
""".split()


def _tags(op) -> list[str]:
    return sorted(str(t).split(".")[-1] for t in op.tags)


def _wanted_overload(name: str) -> bool:
    # Out variants duplicate the functional ones for our purposes; keep the data small.
    return not (name == "out" or name.endswith("_out") or name.startswith("out") or "out_" in name)


def collect() -> dict:
    core: set[str] = set()
    ops: dict[str, dict] = {}

    def add(packet_name: str, overload: str) -> None:
        op = getattr(getattr(torch.ops.aten, packet_name), overload)
        entry = {"schema": str(op._schema), "tags": _tags(op)}
        ops[f"{packet_name}.{overload}"] = entry
        if torch.Tag.core in op.tags:
            core.add(f"{packet_name}.{overload}")

    names = sorted({s.name.split("::", 1)[1] for s in torch._C._jit_get_all_schemas() if s.name.startswith("aten::")})
    packets = {}
    for name in names:
        packet = getattr(torch.ops.aten, name, None)
        if packet is not None and hasattr(packet, "overloads"):
            packets[name] = packet
    core_packets = {n for n, p in packets.items()
                    if any(torch.Tag.core in getattr(p, ov).tags for ov in p.overloads())}
    wanted = core_packets | {n for n in COMMON_NON_CORE if n in packets}
    # In-place variants of everything wanted: capture records them before functionalization.
    wanted |= {n + "_" for n in list(wanted) if n + "_" in packets}
    for name in sorted(wanted):
        for ov in packets[name].overloads():
            op = getattr(packets[name], ov)
            if torch.Tag.core in op.tags or _wanted_overload(ov):
                add(name, ov)
    missing = [n for n in COMMON_NON_CORE if n not in packets]
    if missing:
        print(f"note: not in this torch: {' '.join(missing)}", file=sys.stderr)
    return {"version": VERSION, "torch_version": torch.__version__.split("+")[0],
            "core": sorted(core), "ops": ops}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="fail if the shipped data is stale")
    args = parser.parse_args()
    text = json.dumps(collect(), indent=1, sort_keys=True) + "\n"
    if args.check:
        if OUT.read_text() != text:
            print(f"{OUT} is stale: rerun {pathlib.Path(__file__).name}", file=sys.stderr)
            return 1
        return 0
    OUT.write_text(text)
    print(f"wrote {OUT} ({len(json.loads(text)['ops'])} overloads)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
