"""Outputs that alias each other or an input come back as views of the same base, as in eager,
on the inference path and the training path (where gradients flow through them as in eager)."""

from __future__ import annotations

import pytest
import torch
from fx_programs import program_from
from helpers import clone_inputs, compare_with_eager

from fireclay_autograd import compile_program


def base_and_views(a):
    y = a * 2 + 1
    return y, y.view(-1), y[1]


def views_of_hidden_base(a):
    y = a.exp()
    return y[0], y[1:], y.t()


def same_tensor_twice(a):
    y = a.sin()
    return y, y


def view_of_input_and_intermediate(a):
    y = a.cos()
    return a.view(-1), y, y.transpose(0, 1)


def split_outputs(a):
    y = a * 3
    first, second, third = y.split(2, dim=1)
    return first, second, third


def unrelated_outputs(a):
    return a * 2, a.sum(0)


def alias_with_non_float(a):
    y = a.tanh()
    return y, y.unsqueeze(0), (a > 0)


CASES = [base_and_views, views_of_hidden_base, same_tensor_twice, view_of_input_and_intermediate,
         split_outputs, unrelated_outputs, alias_with_non_float]


def _groups(outputs):
    """Partition of output positions by storage, as eager shares it."""
    by_ptr: dict[int, list[int]] = {}
    for i, o in enumerate(outputs):
        by_ptr.setdefault(o.untyped_storage().data_ptr(), []).append(i)
    return sorted(by_ptr.values())


@pytest.mark.parametrize("grad", [False, True], ids=["inference", "training"])
@pytest.mark.parametrize("fn", CASES, ids=[c.__name__ for c in CASES])
def test_aliased_outputs_are_views_as_in_eager(fn, grad):
    torch.manual_seed(0)
    a = torch.randn(4, 6, requires_grad=grad)
    compiled = compile_program(program_from(fn, clone_inputs([a])), clone_inputs([a]))
    compare_with_eager(fn, compiled, [a], grad=grad)  # values and gradients

    x = a.detach().clone().requires_grad_(grad)
    with torch.set_grad_enabled(grad):
        got, want = compiled(x), fn(x.detach().clone().requires_grad_(grad))
    assert _groups(got) == _groups(want)
    for g, w in zip(got, want):
        assert g.shape == w.shape and g.stride() == w.stride()
        assert g.requires_grad == w.requires_grad
        assert (g._base is None) == (w._base is None)
    # Writing through one output changes the others exactly as in eager.
    for k in range(len(got)):
        if got[k].dtype.is_floating_point:
            try:
                with torch.no_grad():
                    want[k].fill_(7.0 + k)
                    [w.sum() for w in want]  # eager refuses to read some views after such a write
            except RuntimeError:
                continue  # (views from split may not be written in place under autograd)
            with torch.no_grad():
                got[k].fill_(7.0 + k)
            for g, w in zip(got, want):
                torch.testing.assert_close(g.detach(), w.detach())


def test_gradients_through_a_view_output_and_its_base():
    def fn(a):
        y = a * a
        return y, y[0]

    a = torch.randn(3, 5, requires_grad=True)
    compiled = compile_program(program_from(fn, [a.detach().clone().requires_grad_()]), [a])
    y, row = compiled(a)
    (y.sum() * 2 + row.pow(2).sum()).backward()
    b = a.detach().clone().requires_grad_()
    ye, rowe = fn(b)
    (ye.sum() * 2 + rowe.pow(2).sum()).backward()
    torch.testing.assert_close(a.grad, b.grad)


# Tensors made from Python data while tracing (`new_tensor`, `torch.tensor`) become constants that
# the runtime supplies after the caller's inputs. Eager makes a fresh one on every call, so an
# output that is or views one is a fresh tensor, and a constant mutated in place starts over.
def returns_constant_and_its_view(a):
    c = a.new_tensor([1.0, 2.0, 3.0])
    return a * 2, c, c[1:]


def returns_view_of_constant_only(a):
    c = a.new_tensor([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]])
    return c.t(), a + c[0]


def mutates_a_constant(a):
    c = a.new_tensor([1.0, 2.0, 3.0])
    c.add_(a.detach().sum())
    return a * c, c


CONSTANT_CASES = [returns_constant_and_its_view, returns_view_of_constant_only, mutates_a_constant]


@pytest.mark.parametrize("grad", [False, True], ids=["inference", "training"])
@pytest.mark.parametrize("fn", CONSTANT_CASES, ids=[c.__name__ for c in CONSTANT_CASES])
def test_outputs_from_constants_are_fresh_on_every_call(fn, grad):
    torch.manual_seed(0)
    a = torch.randn(3, requires_grad=grad)
    compiled = compile_program(program_from(fn, clone_inputs([a])), clone_inputs([a]))
    for _ in range(3):
        x = torch.randn(3, requires_grad=grad)
        with torch.set_grad_enabled(grad):
            got, want = compiled(x), fn(x)
        for g, w in zip(got, want):
            torch.testing.assert_close(g, w)
        with torch.no_grad():  # the user owns what was returned: writing to it changes no later call
            for g in got:
                if not g.requires_grad:
                    g.fill_(-1.0)
