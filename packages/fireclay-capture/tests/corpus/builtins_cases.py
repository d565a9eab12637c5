"""Builtins: len, isinstance, getattr/hasattr, range, enumerate, zip, min, max, abs, sum, all,
any, int, float, bool, sorted, reversed, map, filter, type, functools.reduce, itertools."""

import torch

from corpus import Registry, T

CASES = Registry("builtins")
case = CASES
x34 = lambda: (T(3, 4),)


@case(x34)
def len_of_things(x):
    return x * len([1, 2]) + len((1,)) + len({"a": 1}) + len("abc") + len(x)


@case(x34)
def min_max_of_ints(x):
    return x * min(3, 2, 5) + max([1, 9, 4]) + max(x.shape)


@case(x34)
def abs_of_int_and_tensor(x):
    return abs(-3) * x, abs(x)


@case(lambda: ([T(3), T(3), T(3)],))
def sum_of_tensors(xs):
    return sum(xs), sum(xs, torch.ones(3))


@case(x34)
def int_float_bool_conversions(x):
    n = int(3.7) + int("4")
    f = float(2)
    b = bool(0), bool([1]), bool(n)
    return x * n * f, b


@case(x34)
def sorted_reversed(x):
    return x * sorted([3, 1, 2])[0], list(reversed([1, 2, 3])), sorted((3, 1), reverse=True)


@case(x34)
def map_filter(x):
    squares = list(map(lambda i: i * i, range(4)))
    odd = list(filter(lambda i: i % 2, range(5)))
    return x * sum(squares), odd


@case(x34)
def zip_three(x):
    out = []
    for a, b, c in zip([1, 2], (3, 4), range(5)):
        out.append(x * (a + b + c))
    return out


@case(x34)
def type_checks(x):
    return type(3) is int, type("s") == str, isinstance(x, torch.Tensor), isinstance(3, (int, float))  # noqa: E721, UP003


@case(x34)
def round_divmod_pow(x):
    q, r = divmod(17, 5)
    return x * q + r, round(2.567, 2), pow(2, 5)


@case(x34)
def all_any_lists(x):
    return all([True, 1, "a"]), any([0, None, ""]), x


@case(x34)
def iter_next(x):
    it = iter([1, 2, 3])
    a = next(it)
    b = next(it)
    return x * (a + b), next(it, 10), next(it, 10)


@case(x34)
def str_methods(x):
    s = "Hello_World"
    return s.lower(), s.split("_"), "-".join(["a", "b"]), s.startswith("He"), s.replace("o", "0"), x


@case(x34)
def enumerate_with_start(x):
    return [x * i for i, _ in enumerate("ab", start=5)]


@case(x34)
def list_tuple_dict_constructors(x):
    return list((x, x)), tuple([x]), dict(a=x, b=1), dict([("k", x)])


@case(x34)
def max_over_generator(x):
    return x * max(i * 2 for i in range(4)), min((3, 1, 2))


@case(x34)
def functools_reduce(x):
    # Reformer: reduce(mul, axial_pos_shape) < sequence_length
    import functools
    import operator

    n = functools.reduce(operator.mul, (2, 3, 4))
    total = functools.reduce(lambda a, b: a + b * b, [x, x.sin(), x.cos()])
    started = functools.reduce(operator.add, [], x * 2)
    return x * n + total, started, functools.reduce(max, x.shape, 1)


@case(x34)
def itertools_finite_iterators(x):
    # torch.nn.modules.utils._ntuple: tuple(repeat(x, n)) for a convolution's sizes (UnivNet)
    import itertools
    import operator

    pads = tuple(itertools.repeat(1, 2))
    both = list(itertools.chain([x], (x.cos(),)))
    grid = [a * b for a, b in itertools.product(range(2), (1, 3))]
    first = list(itertools.islice([x, x + 1, x + 2, x + 3], 1, None, 2))
    steps = [b - a for a, b in itertools.pairwise([x, x.exp(), x.sin()])]
    running = list(itertools.accumulate([x, x, x], operator.mul))
    sums = list(itertools.accumulate((1, 2, 3), initial=10))
    pairs = list(itertools.starmap(operator.add, [(x, 1.0), (x, x)]))
    return pads, both, grid, first, steps, running, sums, pairs
