"""Control flow on Python values (unrolled): if/elif/else, for/while over constants and
shapes, break/continue, early return, assertions, recursion of constant depth."""

import torch

from corpus import Registry, T

CASES = Registry("control_flow")
case = CASES
x34 = lambda: (T(3, 4),)


@case(x34)
def if_on_shape(x):
    if x.shape[0] > 2:
        return x * 2
    return x


@case(x34)
def if_elif_else_on_rank(x):
    if x.dim() == 1:
        y = x
    elif x.dim() == 2:
        y = x.sum(0)
    else:
        y = x.flatten()
    return y


@case(x34)
def for_range_unrolled(x):
    for i in range(4):
        x = x + i
    return x


@case(x34)
def for_range_with_step_and_negative(x):
    acc = x
    for i in range(10, 0, -3):
        acc = acc * 0.5 + i
    return acc


@case(x34)
def while_loop_on_counter(x):
    i = 0
    while i < 3:
        x = x.sin()
        i += 1
    return x


@case(x34)
def break_and_continue(x):
    for i in range(10):
        if i % 2 == 0:
            continue
        if i > 6:
            break
        x = x + i
    return x


@case(x34)
def for_else(x):
    for i in range(3):
        if i == 5:
            break
    else:
        x = x * 10
    return x


@case(x34)
def nested_loops(x):
    for i in range(2):
        for j in range(3):
            x = x + i * j
    return x


@case(x34)
def loop_over_shape(x):
    total = 0
    for d in x.shape:
        total += d
    return x * total


@case(x34)
def assert_on_shape(x):
    assert x.shape[-1] == 4, "last dim must be 4"
    return x.relu()


@case(x34)
def ternary_and_boolean_ops(x):
    n = x.shape[0]
    scale = 2 if n == 3 else 3
    flag = n > 1 and x.shape[1] < 10 or False
    return x * scale, flag, not flag


@case(x34)
def none_checks(x, bias=None):
    if bias is not None:
        x = x + bias
    if bias is None:
        x = x - 1
    return x


@case(lambda: (T(3, 4), T(4)))
def optional_argument_given(x, bias=None):
    if bias is not None:
        x = x + bias
    return x


def _fact(n):
    return 1 if n <= 1 else n * _fact(n - 1)


@case(x34)
def recursion_constant_depth(x):
    return x * _fact(5)


def _apply_n(x, n):
    if n == 0:
        return x
    return _apply_n(x.cos(), n - 1)


@case(x34)
def tensor_recursion(x):
    return _apply_n(x, 3)


@case(x34)
def loop_over_tensor_rows(x):
    rows = []
    for row in x:
        rows.append(row * 2)
    return torch.stack(rows)


@case(x34)
def enumerate_zip_loop(x):
    out = []
    for i, (a, b) in enumerate(zip([1, 2, 3], ["a", "b", "c"])):
        out.append(x * a + i if b != "b" else x)
    return out


@case(x34)
def early_return_in_loop(x):
    for i in range(5):
        if i == 2:
            return x * i
    return x


@case(x34)
def in_and_not_in(x):
    names = ("relu", "gelu")
    d = {"a": 1}
    if "relu" in names and "b" not in d:
        x = x.relu()
    return x


@case(x34)
def is_and_is_not(x):
    y = None
    z = x
    return (x is z), (y is None), (x is not None)


@case(x34)
def chained_comparison(x):
    n = x.shape[0]
    if 0 < n <= 3 < x.shape[1]:
        return x + 1
    return x


@case(x34)
def while_true_with_break(x):
    i = 0
    while True:
        x = x * 1.5
        i += 1
        if i >= 3:
            break
    return x


@case(x34)
def walrus(x):
    if (n := x.shape[0]) > 2:
        return x * n
    return x


@case(x34)
def try_finally_no_exception(x):
    y = x
    try:
        y = y + 1
    finally:
        y = y * 2
    return y


@case(x34)
def match_statement(x):
    match x.dim():
        case 1:
            return x
        case 2:
            return x.t()
        case _:
            return x.flatten()
