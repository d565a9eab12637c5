"""torch.vmap / torch.func.vmap in captured code: batched into plain torch ops in one graph,
checked against eager (torch's own vmap) on fresh random inputs; an op without a batching rule
makes a graph break that runs the vmapped call eagerly, with a warning."""

from __future__ import annotations

import logging

import pytest
import torch

from fireclay_capture import capture, explain
from fireclay_ir import verify

F = torch.nn.functional

B = 3  # the batch; the per-example sizes below differ from it so that a wrong dim shows


def pointwise(x, y):
    return torch.vmap(lambda a, b: (a * b + 1).sigmoid() - b.abs())(x, y)


def in_dims_none(x, y):  # y is the same for every example: a matmul and a broadcast
    return torch.vmap(lambda a, w: a @ w + w.sum(0), in_dims=(0, None))(x, y.T[:, :4])


def in_dims_one(x, y):
    return torch.func.vmap(lambda a: a.sum(0) * a.amax(-1).mean(), in_dims=1)(x.reshape(5, B, 4))


def out_dims_one(x, y):
    return torch.vmap(lambda a, b: (a.exp(), a - b), out_dims=(1, 0))(x, y)


def nested_outer_product(x, y):
    inner = torch.vmap(lambda a, b: a * b, in_dims=(0, None))
    return torch.vmap(inner, in_dims=(None, 0))(x[0], y[:, 0])


def nested_four_levels(x, y):
    def score(b, h, q, k):
        return (q - k).abs() * (h + 1) + b

    fn = score
    for dims in [(None, None, None, 0), (None, None, 0, None), (None, 0, None, None), (0, None, None, None)]:
        fn = torch.vmap(fn, in_dims=dims, out_dims=0)
    return fn(torch.arange(B), torch.arange(2), torch.arange(4) + 1, torch.arange(5)) * x.sum()


def nested_three_levels_tensors(x, y):
    f = torch.vmap(torch.vmap(torch.vmap(lambda a, b: a * b - a.sum(), in_dims=(0, None)), in_dims=(None, 0)))
    return f(x.reshape(B, 5, 4)[:, :, :2], y.reshape(B, 4, 5)[:, :3, :2])


def closure_over_outer(x, y):
    w = y.mean(0) * 2  # made in the graph before the vmap

    def f(a):
        return a * w + x[0]  # x: an input of the captured function the body reads first

    return torch.vmap(f)(y)


def batched_index_tensors(x, y):
    table = x.reshape(5, B, 4)
    idx = (y.abs() * 10).long() % 5  # [B, 5]: one index vector per example
    return torch.vmap(lambda i, t: t[i] + table[i, 0], in_dims=(0, 1))(idx, table)


def index_forms(x, y):
    idx = (y.abs() * 10).long()[:, :2] % 4  # [B, 2]

    def f(t, i):  # t: [4, 4] per example
        return t[:, i] + t[i % 3][:, 1:3].sum(-1) + t[None, ..., i].squeeze(0) * 2 + t[1:, i, None][0, :, 0] \
            + t[i, 1:3][:, 0] + t[2, i]

    return torch.vmap(f)(x.reshape(B, 4, 5)[:, :, :4], idx)


def reductions_and_views(x, y):
    def f(a):
        s = a.softmax(-1) * a.amax(dim=0, keepdim=True) + a.mean()
        t = s.transpose(0, 1).reshape(-1).view(5, 4).unsqueeze(0).permute(1, 0, 2).flatten(1)
        return torch.cat([t, t.max(dim=1, keepdim=True).values], dim=1).squeeze().sum(1) + a.max()

    return torch.vmap(f)(x.reshape(B, 4, 5))


def stack_expand_where(x, y):
    def f(a, b):
        m = a > b
        return torch.stack([torch.where(m, a, b), a.expand(2, 5).sum(0), b.new_zeros(5)], 0).masked_fill(~m, 0.5)

    return torch.vmap(f)(x[:, :5], y[:, :5])


def promotion_of_zero_d(x, y):
    s = x.sum(1).double()  # 0-d float64 per example against a float32 vector: float32
    return torch.vmap(lambda a, v: a * v + (a > v).float(), in_dims=(0, None))(s, y[0])


def same_tensor_twice(x, y):  # one tensor mapped over two different dims
    z = x[:, :B]
    return torch.vmap(lambda a, b: a * 2 - b, in_dims=(0, 1))(z, z)


def promotion_against_zero_d(x, y):  # a batched 0-d float32 against an unbatched 0-d float64
    c = y[0, 0].double()
    return torch.vmap(lambda a: a * c + (a < c).double())(x[:, 0])



def scalar_batched_indices(x, y):  # a[i] with a batched 0-d index: indexing, as torch's vmap does it
    table = y[0].reshape(4, 5)
    idx = torch.arange(B) % 4

    def f(a, i):
        return a.reshape(4, 5)[i] * table[i, 2] + table[i][[0, 1, 1, 3, 4]]

    return torch.vmap(f)(x, idx)


def differentiable(x, y):
    w = y[0].reshape(4, 5)
    return torch.vmap(lambda a: (a.reshape(4, 5) @ w.T).softmax(-1).sum(0))(x)


def dropout_not_training(x, y):
    return torch.vmap(lambda a: torch.nn.functional.dropout(a, 0.5, training=False) * 2)(x)


@torch.vmap
def _row_norms(a):  # made by torch.vmap before any capture
    return (a * a).sum().sqrt()


_scaled_rows = torch.func.vmap(lambda a, s: a * s, in_dims=(1, None), out_dims=1)


def vmapped_at_module_level(x, y):
    return _row_norms(x) + _scaled_rows(y.T, 2.0).T.sum(1)


CASES = {
    "pointwise": pointwise,
    "in_dims_none": in_dims_none,
    "in_dims_one": in_dims_one,
    "out_dims_one": out_dims_one,
    "nested_outer_product": nested_outer_product,
    "nested_four_levels": nested_four_levels,
    "nested_three_levels_tensors": nested_three_levels_tensors,
    "closure_over_outer": closure_over_outer,
    "batched_index_tensors": batched_index_tensors,
    "index_forms": index_forms,
    "reductions_and_views": reductions_and_views,
    "stack_expand_where": stack_expand_where,
    "promotion_of_zero_d": promotion_of_zero_d,
    "same_tensor_twice": same_tensor_twice,
    "promotion_against_zero_d": promotion_against_zero_d,
    "scalar_batched_indices": scalar_batched_indices,
    "differentiable": differentiable,
    "dropout_not_training": dropout_not_training,
    "vmapped_at_module_level": vmapped_at_module_level,
}


def _inputs():
    return torch.randn(B, 20), torch.randn(B, 20)


@pytest.mark.parametrize("name", sorted(CASES))
def test_vmap_is_captured_in_one_graph_and_matches_eager(name):
    fn = CASES[name]
    compiled = capture(fn, fullgraph=True)
    for _ in range(3):
        x, y = _inputs()
        expected = fn(x, y)
        got = compiled(x, y)
        torch.testing.assert_close(got, expected)
        for g, e in zip(got if isinstance(got, tuple) else [got], expected if isinstance(expected, tuple) else [expected]):
            assert g.dtype == e.dtype and g.shape == e.shape
    assert compiled.stats.captures == 1
    program = compiled.last_program
    verify(program)
    ops = {n.op for g in program.graphs.values() for n in g.nodes}
    assert not any("vmap" in op for op in ops), ops


def without_rule(x, y):
    z = x * 2
    out = torch.vmap(lambda a: torch.topk(a, 2).values)(z)  # topk has no batching rule
    return out + 1


def test_symbolic_batch_and_example_sizes():
    def f(x, y):
        return torch.vmap(lambda a, b: (a * b).sum() + a[1:].mean() + b[a.argmax()], in_dims=(0, None))(x, y)

    compiled = capture(f, dynamic=True)
    for n in (5, 7, 9):
        x, y = torch.randn(n, 6), torch.randn(6)
        torch.testing.assert_close(compiled(x, y), f(x, y))
    assert compiled.stats.fallbacks == 0 and compiled.stats.captures == 1


def test_random_ops_inside_vmap_run_under_torchs_vmap():
    def f(x):
        return torch.vmap(lambda a: a + torch.rand(5), randomness="different")(x)

    out = capture(f)(torch.zeros(B, 5))
    assert out.shape == (B, 5) and not torch.equal(out[0], out[1])  # drawn per example, as torch's vmap does


def test_gradients_through_vmap_match_eager():
    compiled = capture(differentiable, fullgraph=True)
    x, y = (t.requires_grad_() for t in _inputs())
    x2, y2 = (t.detach().clone().requires_grad_() for t in (x, y))
    compiled(x, y).pow(2).sum().backward()
    differentiable(x2, y2).pow(2).sum().backward()
    torch.testing.assert_close(x.grad, x2.grad)
    torch.testing.assert_close(y.grad, y2.grad)


def test_op_without_rule_breaks_and_runs_eagerly_with_a_warning(caplog):
    compiled = capture(without_rule)
    x, y = _inputs()
    with caplog.at_level(logging.WARNING, logger="fireclay_capture"):
        torch.testing.assert_close(compiled(x, y), without_rule(x, y))
    assert any("no batching rule for torch.topk" in r.getMessage() for r in caplog.records)
    report = explain(without_rule)(x, y)
    assert any("no batching rule" in b.reason and "topk" in b.reason for b in report.break_reasons)
    x, y = _inputs()
    torch.testing.assert_close(compiled(x, y), without_rule(x, y))


def test_fullgraph_names_the_missing_rule():
    with pytest.raises(Exception, match="no batching rule for torch.topk"):
        capture(without_rule, fullgraph=True)(*_inputs())


def in_place_inside(x, y):
    def f(a):
        b = a.clone()
        b.add_(1)  # an in-place op has no rule: the call runs eagerly, never a wrong answer
        return b

    return torch.vmap(f)(x)


def test_in_place_op_inside_vmap_breaks():
    compiled = capture(in_place_inside)
    x, y = _inputs()
    torch.testing.assert_close(compiled(x, y), in_place_inside(x, y))


# One op family each, per-example x of shape (3, 2, 4), the batch of 5 mapped at several dims.
_I2 = torch.tensor([[0, 2], [1, 1]])
RULE_BODIES = {
    "sum_neg": lambda a: a.sum(-2),
    "sum_keep": lambda a: a.sum((0, 2), keepdim=True),
    "mean_all": lambda a: a.mean(),
    "amax": lambda a: torch.amax(a, dim=1),
    "max_dim": lambda a: a.max(0)[1].float().sum() + a.max(-1).values,
    "min_all": lambda a: a.min(),
    "argmax_all": lambda a: a.argmax().float(),
    "any": lambda a: (a > 0).any(-1).float() + (a > 0).all().float(),
    "logsumexp": lambda a: a.logsumexp(1),
    "prod": lambda a: a.prod(2),
    "softmax": lambda a: F.softmax(a, dim=0) + a.log_softmax(-1),
    "cumsum": lambda a: a.cumsum(1),
    "flip": lambda a: a.flip([0, 2]),
    "transpose": lambda a: a.transpose(-1, 0) * 2,
    "permute": lambda a: a.permute(2, 0, 1).contiguous(),
    "movedim": lambda a: a.movedim(0, -1),
    "reshape": lambda a: a.reshape(-1, 4)[1:],
    "view_flat": lambda a: a.flatten() + 1,
    "flatten_mid": lambda a: a.flatten(0, 1),
    "unsqueeze_neg": lambda a: a.unsqueeze(-1) * a.unsqueeze(0).sum(0, keepdim=True).unsqueeze(-1),
    "squeeze": lambda a: a[:, :1].squeeze() + a[:, :1].squeeze(1),
    "expand": lambda a: a[:, :, :1].expand(3, 2, 4) + a.expand(2, 3, 2, 4)[1],
    "select_narrow": lambda a: a.select(1, 1) + a.narrow(1, 0, 1).squeeze(1),
    "cat": lambda a: torch.cat([a, a * 2], dim=-1),
    "stack": lambda a: torch.stack([a, a], 1),
    "matmul_mv": lambda a: a[0] @ a[1].T @ a[2, :, 0] + (a[0, 0] @ a[1].T).sum(),
    "matmul_bmm": lambda a: a @ a.transpose(1, 2),
    "getitem_basic": lambda a: a[1, ..., None, ::2],
    "getitem_idx2d": lambda a: a[_I2].sum((0, 1, 2)) + a[:, _I2 % 2].sum((0, 1, 2)),
    "getitem_nonadj": lambda a: a[_I2[0], :, _I2[1]],
    "getitem_int_tensor": lambda a: a[1, :, _I2[0]],
    "where_scalar": lambda a: torch.where(a > 0, a, 0.0),
    "pow_div": lambda a: (a.abs() + 1) ** 0.5 / (a * a + 1),
    "int_ops": lambda a: ((a * 10).long() // 3 % 4).float(),
    "type_as": lambda a: a.long().type_as(a) + a.to(torch.float64).float(),
    "zeros_like": lambda a: torch.zeros_like(a) + torch.full_like(a, 2.0) + a.new_ones(4),
    "T": lambda a: a.permute(2, 1, 0).reshape(-1) + a.mT.reshape(-1) + (a[0].t() @ a[1]).sum() + a[0, 0].t().sum(),
}
_DIMS = [(0, 0), (1, 0), (2, 1), (-1, -1)]


@pytest.mark.parametrize("name", sorted(RULE_BODIES))
def test_batching_rules_match_torchs_vmap(name):
    in_dim, out_dim = _DIMS[sorted(RULE_BODIES).index(name) % len(_DIMS)]
    if name in ("mean_all", "min_all", "argmax_all") and out_dim not in (0, -1):
        in_dim, out_dim = 1, 0  # a 0-d result has only out_dim 0

    def f(x):
        return torch.vmap(RULE_BODIES[name], in_dims=in_dim, out_dims=out_dim)(x)

    shape = [3, 2, 4]
    shape.insert(in_dim if in_dim >= 0 else 3, 5)
    compiled = capture(f, fullgraph=True)
    x = torch.randn(*shape)
    got, expected = compiled(x), f(x)
    assert got.dtype == expected.dtype
    torch.testing.assert_close(got, expected)


# --------------------------------------------------------------------------- transformers' masks

masking_utils = pytest.importorskip("transformers.masking_utils")


def _mask_functions():
    mu = masking_utils
    return {
        "causal": lambda pad: mu.causal_mask_function,
        "sliding_causal": lambda pad: mu.sliding_window_causal_mask_function(3),
        "sliding_bidirectional": lambda pad: mu.sliding_window_bidirectional_mask_function(2),
        "chunked_causal": lambda pad: mu.chunked_causal_mask_function(2, torch.zeros(2, dtype=torch.long)),
        "or_blockwise": lambda pad: mu.or_masks(mu.causal_mask_function,
                                               mu.blockwise_overlay(torch.tensor([[0, 0, 1, 1, -1, -1]] * 2))),
        "packed": lambda pad: mu.and_masks(mu.causal_mask_function,
                                           mu.packed_sequence_mask_function(torch.tensor([[0, 0, 1, 1, 1, 2]] * 2))),
    }


@pytest.mark.parametrize("kind", ["causal", "sliding_causal", "sliding_bidirectional", "chunked_causal",
                                  "or_blockwise", "packed"])
@pytest.mark.parametrize("padded", [False, True])
def test_transformers_vmap_masks_match_eager(kind, padded):
    make = _mask_functions()[kind]

    def build(x, pad):
        mask = masking_utils.sdpa_mask(batch_size=2, q_length=6, kv_length=6, mask_function=make(pad),
                                       attention_mask=pad if padded else None, allow_is_causal_skip=False,
                                       use_vmap=True)
        return x.masked_fill(~mask, -1.0), mask

    compiled = capture(build, fullgraph=True)
    for _ in range(2):
        x = torch.randn(2, 1, 6, 6)
        pad = torch.rand(2, 6) > 0.3
        got, expected = compiled(x, pad), build(x, pad)
        torch.testing.assert_close(got, expected)
    assert compiled.stats.captures == 1


def test_index_mode_outside_vmap_matches_eager():
    from torch._dynamo._trace_wrapped_higher_order_op import (
        TransformGetItemToIndex,  # baseline-ok: the test's reference
    )

    def f(x, i):
        with TransformGetItemToIndex():
            return x[i, 1] + x[0, i]

    compiled = capture(f, fullgraph=True)
    x, i = torch.randn(4, 4), torch.tensor(2)
    torch.testing.assert_close(compiled(x, i), f(x, i))


def test_op_namespaces_are_not_taken_for_vmapped_functions():
    def f(x):  # torch.ops.aten answers any attribute, __code__ included
        ops = torch.ops.aten
        return ops.add.Tensor(x, x)

    compiled = capture(f, fullgraph=True)
    x = torch.randn(3)
    torch.testing.assert_close(compiled(x), f(x))
