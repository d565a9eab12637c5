"""User functions inlined: nested calls, defaults, *args/**kwargs, closures, lambdas,
decorators, globals, user classes and their methods, f-strings, isinstance dispatch."""

import functools

import torch

from corpus import Registry, T

CASES = Registry("functions")
case = CASES
x34 = lambda: (T(3, 4),)

SCALE = 3.0
CONFIG = {"act": "gelu", "depth": 2}


def helper(x, k=2):
    return x * k


def helper_kwonly(x, *, shift=1.0, **extra):
    return x + shift + sum(extra.values())


def varargs(*args, **kwargs):
    return sum(args) + len(kwargs)


@case(x34)
def nested_calls(x):
    return helper(helper(x), k=3)


@case(x34)
def default_arguments(x):
    return helper(x), helper(x, 5)


@case(x34)
def kwonly_and_var_keyword(x):
    return helper_kwonly(x, shift=2.0, a=1, b=2)


@case(x34)
def star_args_kwargs(x):
    return varargs(x, x * 2, a=1, b=2)


@case(x34)
def reads_globals(x):
    return x * SCALE, CONFIG["depth"]


@case(x34)
def closure_over_constant(x):
    k = 4

    def inner(y):
        return y * k

    return inner(x)


@case(x34)
def closure_over_tensor(x):
    y = x + 1

    def inner(z):
        return z * y

    return inner(x)


@case(x34)
def nonlocal_counter(x):
    count = 0

    def bump():
        nonlocal count
        count += 1

    bump()
    bump()
    return x * count


@case(x34)
def lambdas(x):
    f = lambda t, s=2: t * s
    return f(x), f(x, 3), (lambda: x + 1)()


@case(x34)
def higher_order_function(x):
    def apply(fn, v):
        return fn(v)

    return apply(torch.relu, x), apply(lambda t: t.exp(), x)


def make_adder(n):
    def add(t):
        return t + n

    return add


ADD_FIVE = make_adder(5)


@case(x34)
def closure_made_outside(x):
    return ADD_FIVE(x)


@case(x34)
def closure_made_inside(x):
    add2 = make_adder(2)
    return add2(x)


def twice(fn):
    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        return fn(*args, **kwargs) * 2

    return wrapper


@twice
def decorated(x):
    return x + 1


@case(x34)
def decorator_with_wraps(x):
    return decorated(x)


@case(x34)
def fstrings_on_constants(x):
    name = "layer"
    i = 3
    key = f"{name}_{i:02d}_{x.shape[0]!r}"
    return {key: x}, f"{1.5:.2f}", "%s-%d" % ("a", 2), "{}+{}".format(1, 2)  # noqa: UP031, UP032


def dispatch(v):
    if isinstance(v, torch.Tensor):
        return v * 2
    if isinstance(v, (list, tuple)):
        return [dispatch(i) for i in v]
    if isinstance(v, dict):
        return {k: dispatch(i) for k, i in v.items()}
    return v


@case(lambda: ({"a": T(2), "b": [T(2), 3], "c": "s"},))
def isinstance_dispatch(tree):
    return dispatch(tree)


class Scaler:
    def __init__(self, factor):
        self.factor = factor

    def __call__(self, x):
        return x * self.factor

    def apply(self, x):
        return self.shift(x) * self.factor

    def shift(self, x):
        return x + 1

    @staticmethod
    def static(x):
        return x - 1

    @classmethod
    def make(cls, f):
        return cls(f)

    @property
    def double(self):
        return self.factor * 2


SCALER = Scaler(2.5)


@case(x34)
def user_object_methods(x):
    return SCALER.apply(x), SCALER(x), SCALER.static(x), SCALER.double


@case(x34)
def user_object_created_inside(x):
    s = Scaler(3)
    t = Scaler.make(4)
    return s(x) + t(x), s.factor


@case(lambda: (T(3), Scaler(1.5)))
def user_object_argument(x, s):
    return s.apply(x)


class Base:
    def forward(self, x):
        return x + 1


class Child(Base):
    def forward(self, x):
        return super().forward(x) * 2


@case(x34)
def super_call(x):
    return Child().forward(x)


@case(x34)
def functools_partial(x):
    f = functools.partial(helper, k=7)
    return f(x)


@case(x34)
def getattr_hasattr(x):
    s = SCALER
    return x * getattr(s, "factor"), hasattr(s, "nope"), getattr(s, "nope", 5)  # noqa: B009


@case(x34)
def builtin_on_functions(x):
    return callable(helper), helper.__name__, x


@case(x34)
def keyword_arguments_any_order(x):
    return helper(k=4, x=x)


def gen_squares(n):
    for i in range(n):
        yield i * i


@case(x34)
def user_generator(x):
    return [x * s for s in gen_squares(3)]


@case(x34)
def no_grad_decorated_helper(x):
    @torch.no_grad()
    def inner(t):
        return t * 2

    return inner(x), inner(x).requires_grad


@case(x34)
def import_inside_function(x):
    import math

    from torch.nn import functional as F2

    return F2.relu(x) * math.e


@case(x34)
def deep_inline_chain(x):
    def a(t):
        return b(t) + 1

    def b(t):
        return c(t) * 2

    def c(t):
        return t.sin()

    return a(x)


@torch.no_grad()
def _no_grad_module_level(t):
    return t * 3


@case(lambda: (T(3, 4, requires_grad=True),))
def no_grad_decorator_at_module_level(x):
    y = _no_grad_module_level(x)
    return y, y.requires_grad, (x * 2).requires_grad
