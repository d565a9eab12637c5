"""A table of torch programs over sized inputs, shared by the fake tensor tests.

Each case builds its inputs from named sizes (so the same case runs at other sizes) and runs
ordinary torch code on them. ``dynamic`` names, per input, the dims that carry a size
parameter and may be made symbolic.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
import torch.nn.functional as F


@dataclass
class Case:
    name: str
    inputs: object            # sizes dict -> list of tensors
    fn: object                # *tensors -> tensor or tuple of tensors
    sizes: dict               # the trace-time sizes
    dynamic: list = field(default_factory=list)  # per input: {dim: size name}
    other_sizes: list = field(default_factory=list)  # further sizes to check symbolic results at


def randn(*shape, **kw):
    return torch.randn(*shape, **kw)


def cl(t):
    return t.contiguous(memory_format=torch.channels_last)


CASES = [
    Case("add_broadcast", lambda s: [randn(s["n"], s["m"]), randn(s["m"])], lambda a, b: a + b,
         {"n": 6, "m": 10}, [{0: "n", 1: "m"}, {0: "m"}], [{"n": 9, "m": 13}, {"n": 2, "m": 3}]),
    Case("mul_scalar_promote", lambda s: [torch.randint(0, 5, (s["n"], 3))], lambda a: a * 2.5,
         {"n": 7}, [{0: "n"}], [{"n": 12}]),
    Case("div_int", lambda s: [torch.randint(1, 5, (s["n"],)), torch.randint(1, 5, (s["n"],))],
         lambda a, b: a / b, {"n": 5}, [{0: "n"}, {0: "n"}], [{"n": 8}]),
    Case("compare_where", lambda s: [randn(s["n"], 4)], lambda a: torch.where(a > 0, a, torch.zeros(())),
         {"n": 5}, [{0: "n"}], [{"n": 11}]),
    Case("mm", lambda s: [randn(s["n"], s["k"]), randn(s["k"], s["m"])], lambda a, b: a @ b,
         {"n": 6, "k": 4, "m": 3}, [{0: "n", 1: "k"}, {0: "k", 1: "m"}], [{"n": 9, "k": 5, "m": 7}]),
    Case("bmm", lambda s: [randn(2, s["n"], 4), randn(2, 4, s["m"])], torch.bmm,
         {"n": 5, "m": 3}, [{1: "n"}, {2: "m"}], [{"n": 8, "m": 6}]),
    Case("matmul_broadcast", lambda s: [randn(3, s["n"], 4), randn(4, 5)], torch.matmul,
         {"n": 6}, [{1: "n"}, {}], [{"n": 10}]),
    Case("linear", lambda s: [randn(s["b"], s["t"], 8), randn(16, 8), randn(16)], F.linear,
         {"b": 2, "t": 5}, [{0: "b", 1: "t"}, {}, {}], [{"b": 3, "t": 9}]),
    Case("addmm", lambda s: [randn(s["m"]), randn(s["n"], 4), randn(4, s["m"])], torch.addmm,
         {"n": 3, "m": 5}, [{0: "m"}, {0: "n"}, {1: "m"}], [{"n": 6, "m": 7}]),
    Case("conv2d_pad", lambda s: [randn(2, 3, s["h"], s["w"]), randn(4, 3, 3, 3)],
         lambda x, w: F.conv2d(x, w, padding=1), {"h": 9, "w": 12}, [{2: "h", 3: "w"}, {}],
         [{"h": 16, "w": 7}]),
    Case("conv2d_stride", lambda s: [randn(2, 3, s["h"], s["h"]), randn(4, 3, 3, 3)],
         lambda x, w: F.conv2d(x, w, stride=2), {"h": 11}, [{2: "h", 3: "h"}, {}], [{"h": 14}, {"h": 5}]),
    Case("conv2d_channels_last", lambda s: [cl(randn(2, 3, s["h"], s["h"])), cl(randn(4, 3, 3, 3))],
         lambda x, w: F.conv2d(x, w, padding=1), {"h": 8}, [{}, {}], []),
    Case("conv1d", lambda s: [randn(2, 3, s["t"]), randn(5, 3, 4)], lambda x, w: F.conv1d(x, w, dilation=2),
         {"t": 20}, [{2: "t"}, {}], [{"t": 31}]),
    Case("max_pool2d", lambda s: [randn(2, 3, s["h"], s["h"])], lambda x: F.max_pool2d(x, 2),
         {"h": 8}, [{2: "h", 3: "h"}], [{"h": 13}]),
    Case("avg_pool2d", lambda s: [randn(2, 3, s["h"], s["h"])], lambda x: F.avg_pool2d(x, 3, stride=2, padding=1),
         {"h": 9}, [{2: "h", 3: "h"}], [{"h": 16}]),
    Case("adaptive_avg_pool2d", lambda s: [randn(2, 3, s["h"], s["h"])], lambda x: F.adaptive_avg_pool2d(x, 1),
         {"h": 7}, [{2: "h", 3: "h"}], [{"h": 12}]),
    Case("relu_gelu", lambda s: [randn(s["n"], 8)], lambda x: F.gelu(F.relu(x)),
         {"n": 4}, [{0: "n"}], [{"n": 9}]),
    Case("softmax", lambda s: [randn(s["n"], s["m"])], lambda x: x.softmax(-1), {"n": 3, "m": 6},
         [{0: "n", 1: "m"}], [{"n": 5, "m": 11}]),
    Case("log_softmax_dim0", lambda s: [randn(s["n"], s["m"])], lambda x: F.log_softmax(x, 0), {"n": 3, "m": 6},
         [{0: "n", 1: "m"}], [{"n": 5, "m": 11}]),
    Case("layer_norm", lambda s: [randn(s["b"], s["t"], 8), randn(8), randn(8)],
         lambda x, w, b: F.layer_norm(x, (8,), w, b), {"b": 2, "t": 5}, [{0: "b", 1: "t"}, {}, {}],
         [{"b": 4, "t": 3}]),
    Case("batch_norm_eval", lambda s: [randn(s["n"], 4, 5), randn(4), randn(4).abs()],
         lambda x, m, v: F.batch_norm(x, m, v, training=False), {"n": 3}, [{0: "n"}, {}, {}], [{"n": 6}]),
    Case("embedding", lambda s: [torch.randint(0, 10, (s["b"], s["t"])), randn(10, 6)], F.embedding,
         {"b": 2, "t": 7}, [{0: "b", 1: "t"}, {}], [{"b": 5, "t": 3}]),
    Case("sum_keepdim", lambda s: [randn(s["n"], s["m"], 3)], lambda x: x.sum(1, keepdim=True),
         {"n": 4, "m": 5}, [{0: "n", 1: "m"}], [{"n": 6, "m": 2}]),
    Case("mean_all", lambda s: [randn(s["n"], 3)], lambda x: x.mean(), {"n": 4}, [{0: "n"}], [{"n": 9}]),
    Case("amax_argmax", lambda s: [randn(s["n"], s["m"])], lambda x: (x.amax(0), x.argmax(1)),
         {"n": 4, "m": 6}, [{0: "n", 1: "m"}], [{"n": 7, "m": 3}]),
    Case("cumsum", lambda s: [randn(s["n"], 5)], lambda x: x.cumsum(0), {"n": 6}, [{0: "n"}], [{"n": 10}]),
    Case("transpose_contiguous", lambda s: [randn(s["n"], s["m"])], lambda x: x.t().contiguous(),
         {"n": 3, "m": 5}, [{0: "n", 1: "m"}], [{"n": 8, "m": 2}]),
    Case("permute", lambda s: [randn(2, s["n"], s["m"])], lambda x: x.permute(2, 0, 1),
         {"n": 3, "m": 5}, [{1: "n", 2: "m"}], [{"n": 4, "m": 7}]),
    Case("view_flatten", lambda s: [randn(s["n"], 4, 3)], lambda x: x.view(x.shape[0], -1),
         {"n": 5}, [{0: "n"}], [{"n": 9}]),
    Case("reshape_noncontiguous", lambda s: [randn(s["n"], 6)], lambda x: x.t().reshape(-1),
         {"n": 4}, [{0: "n"}], [{"n": 7}]),
    Case("flatten_unsqueeze_squeeze", lambda s: [randn(s["n"], 1, 3)],
         lambda x: x.squeeze(1).unsqueeze(0).flatten(), {"n": 5}, [{0: "n"}], [{"n": 8}]),
    Case("expand", lambda s: [randn(s["n"], 1)], lambda x: x.expand(-1, 4), {"n": 3}, [{0: "n"}], [{"n": 6}]),
    Case("cat", lambda s: [randn(s["n"], 3), randn(s["m"], 3)], lambda a, b: torch.cat([a, b]),
         {"n": 4, "m": 6}, [{0: "n"}, {0: "m"}], [{"n": 2, "m": 9}]),
    Case("stack", lambda s: [randn(s["n"], 3), randn(s["n"], 3)], lambda a, b: torch.stack([a, b], 1),
         {"n": 4}, [{0: "n"}, {0: "n"}], [{"n": 7}]),
    Case("split_chunk", lambda s: [randn(s["n"], 6)], lambda x: (x.split(2, 1), x.chunk(3, 1)),
         {"n": 5}, [{0: "n"}], [{"n": 3}]),
    Case("slice_step", lambda s: [randn(s["n"], 8)], lambda x: x[1:, ::3], {"n": 6}, [{0: "n"}],
         [{"n": 11}]),
    Case("index_select_gather", lambda s: [randn(s["n"], 5), torch.randint(0, 5, (s["n"], 2))],
         lambda x, i: (x.index_select(1, i[0]), x.gather(1, i)), {"n": 4}, [{0: "n"}, {0: "n"}], [{"n": 6}]),
    # Advanced indexing with broadcast index tensors (attention-mask builders do this): the meta
    # kernel broadcasts the indices with expand, which refuses symbolic sizes unless it comes back here.
    Case("advanced_index_broadcast", lambda s: [torch.arange(s["b"] * s["n"]).view(s["b"], s["n"])],
         lambda p: p[torch.arange(p.shape[0])[:, None, None], torch.arange(p.shape[1])[None, :, None]],
         {"b": 2, "n": 5}, [{0: "b", 1: "n"}], [{"b": 3, "n": 7}]),
    Case("advanced_index_tensor", lambda s: [randn(s["n"], 6), torch.randint(0, 6, (s["m"],))],
         lambda x, i: x[:, i], {"n": 3, "m": 4}, [{0: "n"}, {0: "m"}], [{"n": 5, "m": 2}]),
    Case("masked_fill_clamp", lambda s: [randn(s["n"], 4)], lambda x: x.masked_fill(x > 1, 0).clamp(-1, 1),
         {"n": 3}, [{0: "n"}], [{"n": 8}]),
    Case("to_half", lambda s: [randn(s["n"], 3)], lambda x: x.to(torch.float16), {"n": 3}, [{0: "n"}], [{"n": 5}]),
    Case("topk_sort", lambda s: [randn(s["n"], 9)], lambda x: (x.topk(3), x.sort(0)), {"n": 4}, [{0: "n"}],
         [{"n": 6}]),
    Case("pad", lambda s: [randn(2, s["n"], s["m"])], lambda x: F.pad(x, (1, 2, 0, 3)), {"n": 3, "m": 4},
         [{1: "n", 2: "m"}], [{"n": 5, "m": 6}]),
    Case("interpolate_nearest", lambda s: [randn(1, 2, s["h"], s["h"])], lambda x: F.interpolate(x, scale_factor=2),
         {"h": 5}, [{}], []),
    Case("einsum", lambda s: [randn(s["b"], 3, 4), randn(s["b"], 4, 5)], lambda a, b: torch.einsum("bij,bjk->bik", a, b),
         {"b": 2}, [{0: "b"}, {0: "b"}], [{"b": 6}]),
    Case("tril_triu", lambda s: [randn(s["n"], s["n"])], lambda x: x.tril() + x.triu(1), {"n": 5},
         [{0: "n", 1: "n"}], [{"n": 8}]),
    Case("factories", lambda s: [randn(s["n"], 3)],
         lambda x: (torch.zeros_like(x), torch.full((x.shape[0], 2), 3.0), torch.ones(4, dtype=torch.int32),
                    torch.empty(2, 3).new_zeros(5)),
         {"n": 4}, [{0: "n"}], [{"n": 6}]),
    Case("arange", lambda s: [randn(s["n"])], lambda x: x + torch.arange(x.shape[0]), {"n": 5}, [{0: "n"}],
         [{"n": 9}]),
    Case("sdpa", lambda s: [randn(2, 4, s["t"], 8), randn(2, 4, s["t"], 8), randn(2, 4, s["t"], 8)],
         F.scaled_dot_product_attention, {"t": 6}, [{2: "t"}, {2: "t"}, {2: "t"}], [{"t": 9}]),
    Case("inplace_add", lambda s: [randn(s["n"], 3), randn(s["n"], 3)], lambda a, b: a.clone().add_(b),
         {"n": 4}, [{0: "n"}, {0: "n"}], [{"n": 6}]),
]
