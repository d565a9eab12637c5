"""Achieved memory bandwidth of large fused pointwise and reduction kernels, against the card's
measured copy bandwidth (torch's ``copy_`` of a large tensor) and against eager.

Run on a CUDA GPU:  python scripts/bandwidth.py [--scale 1.0]

Bytes per program are fireclay-loops' count for the schedule (each buffer a step reads or writes,
once), so the percentage says how close the generated kernels come to the memory roofline.
"""

from __future__ import annotations

import argparse

import torch
from triton.testing import do_bench

from fireclay_ir import Graph, Program, TensorMeta
from fireclay_triton import compile_program


def _meta(shape, dtype="float32"):
    strides, acc = [], 1
    for d in reversed(shape):
        strides.append(acc)
        acc *= d
    return TensorMeta(dtype, tuple(shape), tuple(reversed(strides)), 0, "cuda:0")


def _out(op, args):
    """Shape of an aten op's result, from its meta kernel."""
    meta_args = [torch.empty(a.type.shape, device="meta") if hasattr(a, "type") else a for a in args]
    packet, _, overload = op.partition(".")
    r = getattr(getattr(torch.ops.aten, packet), overload)(*meta_args)
    rs = r if isinstance(r, (tuple, list)) else [r]
    return [_meta(tuple(t.shape), str(t.dtype).removeprefix("torch.")) for t in rs]


def _call(g, op, *args):
    outs = g.call(f"aten::{op}", args, out=_out(op, args))
    return outs if len(outs) > 1 else outs[0]


def pointwise_program(n):
    g = Graph("main")
    x, y, z = (g.add_input(name, _meta((n,))) for name in "xyz")
    h = _call(g, "mul.Tensor", x, y)
    h = _call(g, "add.Tensor", h, z)
    h = _call(g, "gelu.default", h)
    g.set_outputs([_call(g, "mul.Scalar", h, 0.5)])
    return Program.single(g), [(n,)] * 3


def softmax_program(rows, cols):
    g = Graph("main")
    x = g.add_input("x", _meta((rows, cols)))
    g.set_outputs([_call(g, "_softmax.default", x, 1, False)])
    return Program.single(g), [(rows, cols)]


def layer_norm_program(rows, cols):
    g = Graph("main")
    x = g.add_input("x", _meta((rows, cols)))
    w = g.add_input("w", _meta((cols,)))
    b = g.add_input("b", _meta((cols,)))
    out = _call(g, "native_layer_norm.default", x, [cols], w, b, 1e-5)
    g.set_outputs([out[0]])
    return Program.single(g), [(rows, cols), (cols,), (cols,)]


def row_sum_program(rows, cols):
    g = Graph("main")
    x = g.add_input("x", _meta((rows, cols)))
    g.set_outputs([_call(g, "sum.dim_IntList", x, [1])])
    return Program.single(g), [(rows, cols)]


def column_sum_program(rows, cols):
    g = Graph("main")
    x = g.add_input("x", _meta((rows, cols)))
    g.set_outputs([_call(g, "sum.dim_IntList", x, [0])])
    return Program.single(g), [(rows, cols)]


def layer_norm_weight_grad_program(rows, cols):
    """Layer norm's weight and bias gradients: column sums of ``g * (x - mean) * rstd`` and ``g``
    (a training step's backward when the input needs no gradient)."""
    g = Graph("main")
    grad = g.add_input("g", _meta((rows, cols)))
    x = g.add_input("x", _meta((rows, cols)))
    mean = g.add_input("mean", _meta((rows, 1)))
    rstd = g.add_input("rstd", _meta((rows, 1)))
    xhat = _call(g, "mul.Tensor", _call(g, "sub.Tensor", x, mean), rstd)
    g.set_outputs([_call(g, "sum.dim_IntList", _call(g, "mul.Tensor", grad, xhat), [0]),
                   _call(g, "sum.dim_IntList", grad, [0])])
    return Program.single(g), [(rows, cols), (rows, cols), (rows, 1), (rows, 1)]


def transpose_add_program(rows, cols):
    g = Graph("main")
    x = g.add_input("x", _meta((rows, cols)))
    y = g.add_input("y", _meta((cols, rows)))
    g.set_outputs([_call(g, "add.Tensor", _call(g, "permute.default", x, [1, 0]), y)])
    return Program.single(g), [(rows, cols), (cols, rows)]


def eager_of(name):
    return {
        "pointwise gelu(x*y+z)*0.5": lambda x, y, z: torch.nn.functional.gelu(x * y + z) * 0.5,
        "softmax rows": lambda x: torch.softmax(x, 1),
        "layer_norm rows": lambda x, w, b: torch.nn.functional.layer_norm(x, (x.shape[1],), w, b),
        "sum rows": lambda x: x.sum(1),
        "sum columns": lambda x: x.sum(0),
        "transpose x.t() + y": lambda x, y: x.t() + y,
        "layer_norm weight grad": lambda g, x, m, r: (g * ((x - m) * r)).sum(0),
    }[name.split(" [")[0]]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--scale", type=float, default=1.0, help="multiply the problem sizes")
    parser.add_argument("--max-autotune", action="store_true", help="autotune over the larger config set")
    parser.add_argument("--only", default="", help="run the programs whose name contains this text")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("bandwidth.py needs a CUDA GPU")
    s = args.scale
    big = torch.empty(int(256 * 2**20 * s), dtype=torch.float32, device="cuda")
    dst = torch.empty_like(big)
    copy_ms = do_bench(lambda: dst.copy_(big))
    copy_gbs = 2 * big.numel() * 4 / copy_ms / 1e6
    print(f"{torch.cuda.get_device_name()}: torch copy_ bandwidth {copy_gbs:.0f} GB/s")
    big = dst = None  # free the copy buffers before the programs run
    cases = [
        ("pointwise gelu(x*y+z)*0.5", pointwise_program(int(64 * 2**20 * s))),
        ("softmax rows [32768x1024]", softmax_program(int(32768 * s), 1024)),
        ("softmax rows [4096x16384]", softmax_program(int(4096 * s), 16384)),
        ("softmax rows [1024x65536]", softmax_program(int(1024 * s), 65536)),
        ("layer_norm rows [32768x1024]", layer_norm_program(int(32768 * s), 1024)),
        ("layer_norm rows [8192x8192]", layer_norm_program(int(8192 * s), 8192)),
        ("sum rows [32768x2048]", row_sum_program(int(32768 * s), 2048)),
        ("sum columns [16384x4096]", column_sum_program(int(16384 * s), 4096)),
        ("sum columns [65536x1024]", column_sum_program(int(65536 * s), 1024)),
        ("transpose x.t() + y [8192x8192]", transpose_add_program(int(8192 * s), 8192)),
        ("layer_norm weight grad [65536x1024]", layer_norm_weight_grad_program(int(65536 * s), 1024)),
    ]
    header = f"{'program':32s} {'MB':>8s} {'kernels':>7s} {'fireclay ms':>11s} {'GB/s':>7s} {'% copy':>7s} " \
             f"{'eager ms':>9s} {'eager GB/s':>10s}"
    print(header)
    print("-" * len(header))
    for name, (program, shapes) in cases:
        if args.only not in name:
            continue
        inputs = [torch.randn(sh, device="cuda") for sh in shapes]
        compiled = compile_program(program, inputs, max_autotune=args.max_autotune)
        torch.testing.assert_close(compiled(*inputs)[0], eager_of(name)(*inputs), atol=1e-3, rtol=1e-3)
        kinds = ",".join(sorted({k.kind for k in compiled.kernels}))
        nbytes = compiled.scheduled.bytes_moved
        ms = do_bench(lambda c=compiled, i=inputs: c(*i))
        eager = eager_of(name)
        eager_ms = do_bench(lambda f=eager, i=inputs: f(*i))
        gbs = nbytes / ms / 1e6
        print(f"{name:32s} {nbytes / 2**20:8.0f} {len(compiled.kernels):7d} {ms:11.3f} {gbs:7.0f} "
              f"{100 * gbs / copy_gbs:6.1f}% {eager_ms:9.3f} {nbytes / eager_ms / 1e6:10.0f}  {kinds}")


if __name__ == "__main__":
    main()
