"""Functionalization: mutations and aliasing behave as in eager, and none remain in the graph."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from fx_programs import BatchNorm1d, BatchNorm2d, program_from
from helpers import check_against_eager, clone_inputs

from fireclay_autograd import aot_graphs, compile_program, trace_to_aten
from fireclay_autograd.executor import aten_overload


def assert_functional(program):
    for node in program.main.nodes:
        assert node.dialect == "aten", node
        assert not aten_overload(node.op)._schema.is_mutable, f"{node.op} mutates"


def mut_input_add(x):
    x.add_(1)
    return x * 2


def mut_input_view(x):
    x[0].mul_(2)
    return x.sum(1)


def mut_flat_slice(x):
    x.view(-1)[2:5].zero_()
    return x + 1


def mut_transposed_row(x):
    x.t()[1].fill_(3.0)
    return x * 1


def mut_intermediate_seen_by_view(a):
    y = a * 2
    v = y[1]
    y.add_(1)
    return v * 1


def mut_view_seen_by_base(a):
    y = a * 2
    y[:, 1:3].mul_(10)
    return y.sum(0)


def mut_two_inputs(x, s):
    s.mul_(0.9).add_(x.mean(0) * 0.1)
    return x - s


def mut_dtype_kept(x, y):
    x.add_(y * 0.5)
    return x * 1


def mut_diagonal(x):
    x.diagonal().fill_(0.0)
    return x * 1


def mut_copy_from(x, y):
    x[1:].copy_(y[:2])
    return x.exp()


def mut_metadata(a):
    y = a * 1
    y.t_()
    return y + 1


def mut_unsqueeze_then_write(a):
    y = a.clone()
    z = y.unsqueeze(0)
    z.mul_(3)
    return y


def mut_squeeze_dim(a):
    y = a * 1
    y.squeeze_(0)  # squeeze_.dim: one int
    return y + 1


def mut_squeeze_all(a):
    y = a * 1
    y.squeeze_()  # squeeze_.default: no dim
    return y * 2


def mut_squeeze_dims(a):
    y = a * 1
    y.squeeze_((0, 2))  # squeeze_.dims: a list
    return y - 1


def mut_index_put(x, i):
    x.index_put_((i,), torch.tensor(0.5))
    return x * 2


def mut_masked_fill_(x, m):
    x.masked_fill_(m, -1.0)
    return x


def mut_intermediate_twice(a):
    y = a.clone()
    y.mul_(2)
    y.add_(3)
    y[0].sub_(1)
    return y


MUTATIONS = [
    (mut_input_add, lambda: [torch.randn(3, 4)]),
    (mut_input_view, lambda: [torch.randn(3, 4)]),
    (mut_flat_slice, lambda: [torch.randn(3, 4)]),
    (mut_transposed_row, lambda: [torch.randn(3, 4)]),
    (mut_intermediate_seen_by_view, lambda: [torch.randn(3, 4)]),
    (mut_view_seen_by_base, lambda: [torch.randn(3, 4)]),
    (mut_two_inputs, lambda: [torch.randn(3, 4), torch.randn(4)]),
    (mut_dtype_kept, lambda: [torch.randn(3, 4, dtype=torch.float64), torch.randn(3, 4)]),
    (mut_diagonal, lambda: [torch.randn(4, 4)]),
    (mut_copy_from, lambda: [torch.randn(3, 4), torch.randn(3, 4)]),
    (mut_metadata, lambda: [torch.randn(3, 4)]),
    (mut_unsqueeze_then_write, lambda: [torch.randn(3, 4)]),
    (mut_squeeze_dim, lambda: [torch.randn(1, 3, 4)]),
    (mut_squeeze_all, lambda: [torch.randn(1, 3, 1)]),
    (mut_squeeze_dims, lambda: [torch.randn(1, 3, 1, 2)]),
    (mut_index_put, lambda: [torch.randn(5, 2), torch.tensor([0, 3])]),
    (mut_masked_fill_, lambda: [torch.randn(3, 4), torch.rand(3, 4) > 0.5]),
    (mut_intermediate_twice, lambda: [torch.randn(3, 4)]),
]


@pytest.mark.parametrize("fn,make", MUTATIONS, ids=[f.__name__ for f, _ in MUTATIONS])
def test_mutations_match_eager_and_write_back(fn, make):
    inputs = make()
    program = program_from(fn, clone_inputs(inputs))
    aten = trace_to_aten(program, clone_inputs(inputs))
    assert_functional(aten)
    eager_in, ours_in = clone_inputs(inputs), clone_inputs(inputs)
    expected = fn(*eager_in)
    got = compile_program(program, ours_in)(*ours_in)[0]
    torch.testing.assert_close(got, expected)
    for e, o in zip(eager_in, ours_in):  # the inputs were mutated the same way
        torch.testing.assert_close(o, e)


def mut_after_grad_use(x, w):
    y = x @ w
    y.relu_()
    return y.sum(1)


@pytest.mark.parametrize("fn,make", [
    (mut_after_grad_use, lambda: [torch.randn(3, 4), torch.randn(4, 5, requires_grad=True)]),
    (mut_view_seen_by_base, lambda: [torch.randn(3, 4, requires_grad=True)]),
    (mut_intermediate_seen_by_view, lambda: [torch.randn(3, 4, requires_grad=True)]),
    (mut_unsqueeze_then_write, lambda: [torch.randn(3, 4, requires_grad=True)]),
], ids=["relu_", "slice_mul_", "view_sees_add_", "unsqueeze_mul_"])
def test_mutations_of_intermediates_differentiate(fn, make):
    inputs = make()
    check_against_eager(fn, inputs)
    graphs = aot_graphs(program_from(fn, clone_inputs(inputs)), clone_inputs(inputs))
    assert_functional(graphs.forward)
    assert_functional(graphs.backward)


def test_input_mutation_written_back_once_with_grad():
    def fn(x, stats):
        stats.add_(x.detach().sum(0))
        return (x * 2).sum()

    x = torch.randn(3, 4, requires_grad=True)
    stats = torch.zeros(4)
    compiled = compile_program(program_from(fn, [x, stats.clone()]), [x, stats])
    out = compiled(x, stats)[0]
    torch.testing.assert_close(stats, x.detach().sum(0))
    out.backward()
    torch.testing.assert_close(x.grad, torch.full((3, 4), 2.0))


# -- outputs that alias inputs or each other


def ret_view_of_input(x):
    return x.view(-1)


def ret_slice_of_input(x):
    return x[1:, 1]


def ret_input_itself(x):
    return x


def ret_transpose_of_input(x):
    return x.t()


@pytest.mark.parametrize("fn", [ret_view_of_input, ret_slice_of_input, ret_input_itself, ret_transpose_of_input])
def test_output_aliasing_an_input_is_a_real_view(fn):
    x = torch.randn(3, 4)
    out = compile_program(program_from(fn, [x.clone()]), [x])(x)[0]
    expected = fn(x)
    torch.testing.assert_close(out, expected)
    assert out.data_ptr() == expected.data_ptr() and out.stride() == expected.stride()
    out.mul_(0)  # writing through the output reaches the input, as in eager
    assert bool((fn(x) == 0).all())


def test_output_aliasing_an_input_differentiates():
    def fn(x):
        return x.view(-1), x * 2

    check_against_eager(fn, [torch.randn(3, 4, requires_grad=True)])


def test_outputs_aliasing_each_other_share_storage():
    def fn(a):
        y = a + 1
        return y, y.view(-1), y[1]

    a = torch.randn(3, 4)
    y, flat, row = compile_program(program_from(fn, [a]), [a])(a)
    e = fn(a)
    for got, want in zip((y, flat, row), e):
        torch.testing.assert_close(got, want)
    flat.zero_()
    assert bool((y == 0).all()) and bool((row == 0).all())


def test_mutated_then_returned_input_is_the_input():
    def fn(x):
        x.mul_(2)
        return x

    x = torch.randn(3, 4)
    before = x.clone()
    out = compile_program(program_from(fn, [x.clone()]), [x])(x)[0]
    assert out is x
    torch.testing.assert_close(x, before * 2)


# -- BatchNorm running statistics


@pytest.mark.parametrize("momentum", [0.1, 0.5])
def test_batchnorm_training_updates_running_stats(momentum):
    torch.manual_seed(0)
    bn = BatchNorm2d(3, momentum=momentum)
    ref = BatchNorm2d(3, momentum=momentum)
    ref.load_state_dict(bn.state_dict())
    x = torch.randn(4, 3, 5, 5)
    compiled = compile_program(program_from(bn, [x]), [x])
    for _ in range(3):
        x = torch.randn(4, 3, 5, 5) * 2 + 1
        with torch.no_grad():
            got = compiled(x)[0]
            want = ref(x)
        torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(bn.running_mean, ref.running_mean)
    torch.testing.assert_close(bn.running_var, ref.running_var)
    # (num_batches_tracked is not compared: torch.fx runs its add_ at trace time.)
    aten = trace_to_aten(program_from(bn, [x]), [x])
    assert_functional(aten)
    assert len(aten.main.outputs) == 3  # the output, then the new running mean and variance


def test_batchnorm_eval_does_not_touch_stats():
    bn = BatchNorm1d(4).eval()
    bn.running_mean.normal_()
    before = bn.running_mean.clone()
    x = torch.randn(5, 4)
    out = compile_program(program_from(bn, [x]), [x])(x)[0]
    torch.testing.assert_close(out, bn(x))
    torch.testing.assert_close(bn.running_mean, before)
    graphs = trace_to_aten(program_from(bn, [x]), [x])
    assert len(graphs.main.outputs) == 1  # no mutated input comes back


def test_optimizer_style_update_of_inputs():
    def sgd_step(p, g, buf):
        buf.mul_(0.9).add_(g)
        p.add_(buf, alpha=-0.1)
        return p.sum()

    p, g, buf = torch.randn(5), torch.randn(5), torch.randn(5)
    eager = [p.clone(), g.clone(), buf.clone()]
    sgd_step(*eager)
    ours = [p.clone(), g.clone(), buf.clone()]
    compile_program(program_from(sgd_step, clone_inputs(ours)), ours)(*ours)
    for a, b in zip(ours, eager):
        torch.testing.assert_close(a, b)


def test_non_core_inplace_is_decomposed_then_functionalized():
    def fn(x, y):
        x.addcmul_(y, y, value=0.5)
        return F.silu(x)

    inputs = [torch.randn(3, 4), torch.randn(3, 4)]
    aten = trace_to_aten(program_from(fn, clone_inputs(inputs)), clone_inputs(inputs))
    assert_functional(aten)
    assert not aten.main.find("aten::addcmul.default")
    check_against_eager(fn, inputs, grad=False)


def pure_chain(x, w):
    return torch.nn.functional.gelu(x @ w).transpose(0, 1).reshape(-1).softmax(0)


TYPE_CASES = [(fn, make, False) for fn, make in MUTATIONS] + [
    (pure_chain, lambda: [torch.randn(3, 4), torch.randn(4, 6)], False),
    (pure_chain, lambda: [torch.randn(3, 4, requires_grad=True), torch.randn(4, 6, requires_grad=True)], True),
    (mut_after_grad_use, lambda: [torch.randn(3, 4), torch.randn(4, 5, requires_grad=True)], True),
    (mut_view_seen_by_base, lambda: [torch.randn(3, 4, requires_grad=True)], True),
    (mut_intermediate_seen_by_view, lambda: [torch.randn(3, 4, requires_grad=True)], True),
    (mut_unsqueeze_then_write, lambda: [torch.randn(3, 4, requires_grad=True)], True),
]


@pytest.mark.parametrize("fn,make,training", TYPE_CASES,
                         ids=[f"{f.__name__}-{'training' if t else 'inference'}" for f, _, t in TYPE_CASES])
def test_reused_trace_types_equal_inferred_ones(fn, make, training, monkeypatch):
    """Functionalization takes a node's output types from the trace when its inputs kept their
    types; inferring every type again on fakes must give the same graphs."""
    from fireclay_autograd.functionalize import _Functionalizer
    from fireclay_ir import format_program

    def graphs():
        inputs = make()
        program = program_from(fn, clone_inputs(inputs))
        if training:
            traced = aot_graphs(program, clone_inputs(inputs))
            return [format_program(traced.forward), format_program(traced.backward)]
        return [format_program(trace_to_aten(program, clone_inputs(inputs)))]

    reused = graphs()
    monkeypatch.setattr(_Functionalizer, "recorded_types", staticmethod(lambda node, args, kwargs: None))
    assert graphs() == reused
