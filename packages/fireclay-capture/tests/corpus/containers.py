"""Tuples, lists, dicts, sets, slices, ranges; unpacking; comprehensions; structured outputs."""

import collections
import dataclasses
import typing

import torch

from corpus import Registry, T

CASES = Registry("containers")
case = CASES
x34 = lambda: (T(3, 4),)


@case(lambda: ((T(3), T(3)),))
def tuple_input(pair):
    a, b = pair
    return a + b


@case(lambda: ([T(2), T(2), T(2)],))
def list_input(xs):
    return sum(xs), len(xs)


@case(lambda: ({"a": T(2), "b": T(2)},))
def dict_input(d):
    return d["a"] * d["b"], list(d.keys())


@case(lambda: ({"x": T(2), "scale": 3.0},))
def dict_with_constants(d):
    return d["x"] * d["scale"]


@case(lambda: ([[T(2), T(2)], (T(2),)],))
def nested_input(nest):
    return nest[0][0] + nest[0][1] + nest[1][0]


@case(x34)
def return_dict(x):
    return {"sin": x.sin(), "cos": x.cos(), "n": 3}


@case(x34)
def return_nested(x):
    return [x, (x + 1, {"k": [x * 2]})], None


Pair = collections.namedtuple("Pair", ["first", "second"])


class TypedPair(typing.NamedTuple):
    left: torch.Tensor
    right: torch.Tensor
    tag: str = "t"


@case(x34)
def return_namedtuple(x):
    return Pair(x, x * 2)


@case(x34)
def typed_namedtuple_default(x):
    p = TypedPair(x, x + 1)
    return p, p.left * p.right, p.tag


@case(lambda: (Pair(T(3), T(3)),))
def namedtuple_input(p):
    return p.first - p.second, p[0]


@dataclasses.dataclass
class Out:
    logits: torch.Tensor
    hidden: torch.Tensor
    n: int = 0


@case(x34)
def return_dataclass(x):
    return Out(x.relu(), x * 2, n=x.shape[0])


@case(lambda: (Out(T(3), T(3), 5),))
def dataclass_input(o):
    return o.logits + o.hidden * o.n


@case(x34)
def tuple_unpacking_and_star(x):
    a, *rest, b = (x, x + 1, x + 2, x + 3)
    return a + b, len(rest), rest[0]


@case(x34)
def swap_and_multiple_assign(x):
    a, b = x, x * 2
    a, b = b, a
    c = d = a + b
    return a, b, c is d


@case(x34)
def list_methods(x):
    xs = [x]
    xs.append(x + 1)
    xs.extend([x + 2, x + 3])
    xs.insert(0, x - 1)
    last = xs.pop()
    xs.reverse()
    return xs, last, len(xs)


@case(x34)
def list_concat_and_repeat(x):
    a = [x] + [x * 2]
    b = (1, 2) + (3,)
    c = [0] * 3
    return a, b, c


@case(x34)
def list_slicing(x):
    xs = [x, x + 1, x + 2, x + 3]
    return xs[1:3], xs[::-1], xs[-1], xs[:2] + xs[2:]


@case(x34)
def dict_methods(x):
    d = {"a": x}
    d["b"] = x + 1
    d.update({"c": x + 2})
    v = d.get("z", x * 0)
    items = [k + str(i) for i, k in enumerate(d)]
    popped = d.pop("a")
    return d, v, items, popped, "b" in d, len(d)


@case(x34)
def dict_iteration(x):
    d = {"a": 1, "b": 2}
    out = x
    for _k, v in d.items():
        out = out * v
    for k in d:
        out = out + d[k]
    return out, list(d.values())


@case(x34)
def list_comprehension(x):
    return [x * i for i in range(3)]


@case(x34)
def comprehension_with_condition(x):
    return [x + i for i in range(6) if i % 2 == 1]


@case(x34)
def dict_comprehension(x):
    return {f"k{i}": x * i for i in range(3)}


@case(x34)
def set_comprehension_and_sets(x):
    s = {i % 3 for i in range(10)}
    s.add(7)
    return x * len(s), 7 in s, sorted(s)


@case(x34)
def nested_comprehension(x):
    return [[x * i + j for j in range(2)] for i in range(2)]


@case(x34)
def generator_expression(x):
    return sum(x * i for i in range(4)), all(i < 5 for i in range(3)), any(i > 5 for i in range(3))


@case(x34)
def comprehension_closes_over_tensor(x):
    y = x * 2
    return [y + i for i in range(2)]


@case(lambda: ([T(2, 3) for _ in range(3)],))
def comprehension_over_input_list(xs):
    return torch.stack([t.relu() for t in xs]).sum(0)


@case(x34)
def tuple_index_and_count(x):
    t = (1, 2, 3, 2)
    return x * t.index(3), t.count(2)


@case(x34)
def slice_objects(x):
    s = slice(1, 3)
    return x[s], x[:, slice(None, None, 2)]


@case(x34)
def range_object(x):
    r = range(2, 10, 2)
    return x * len(r), r[1], list(r)


@case(lambda: ((T(3), 4, "s"),))
def heterogeneous_tuple_input(t):
    a, n, s = t
    return a * n, s + "!"


@case(x34)
def unpack_dict_into_kwargs(x):
    def f(a, b=1, c=2):
        return a * b + c

    kw = {"b": 3, "c": 4}
    return f(x, **kw)


@case(x34)
def star_args_call(x):
    def f(*args):
        return sum(args)

    parts = [x, x * 2]
    return f(*parts, x * 3)
