"""More Python: recompiles driven by inputs, eager fallbacks, class features, closures in loops,
string handling, nested data, global containers, keyword-only flags."""

import dataclasses
import enum

import torch

from corpus import Registry, T

CASES = Registry("python")
case = CASES
x34 = lambda: (T(3, 4),)


def _shape_per_call(i):
    return (T(3 + i % 2, 4),)


@case(x34, inputs_for_call=_shape_per_call, graphs=2, recompiles=1, calls=4)
def recompile_on_new_shape_then_cache_hits(x):
    return x * x.shape[0]


def _flag_per_call(i):
    return (T(3), i % 3)


@case(lambda: (T(3), 0), inputs_for_call=_flag_per_call, graphs=3, recompiles=2, calls=6)
def recompile_per_int_argument(x, n):
    return x + n


def _dtype_per_call(i):
    return (T(3, dtype=torch.float64 if i else torch.float32),)


@case(x34, inputs_for_call=_dtype_per_call, graphs=2, recompiles=1)
def recompile_on_dtype(x):
    return (x * 2).to(torch.float32)


@case(x34, graphs=1, breaks=1)  # resume functions are counted by test_graph_breaks
def data_dependent_branch_breaks(x):
    if x.sum() > 0:
        return x
    return -x


@case(x34, graphs=1, breaks=1)
def item_breaks(x):
    return x * x.max().item()


@case(x34, graphs=1, breaks=1)
def print_breaks(x):
    print("hello from the captured function")
    return x


_LOG = []


# Each run grows the list, so each call fails the length guard and is traced again (the append
# is replayed after the graph): three captures, never a stale answer.
@case(x34, graphs=3, recompiles=2)
def mutating_global_list(x):
    _LOG.append(1)
    return x + len(_LOG) * 0


class Mode(enum.Enum):
    FAST = 1
    SLOW = 2


@case(x34)
def enum_constants(x):
    mode = Mode.FAST
    if mode is Mode.FAST:
        return x * mode.value
    return x


@dataclasses.dataclass
class Config:
    hidden: int = 4
    act: str = "relu"
    scales: tuple = (1.0, 2.0)


CFG = Config()


@case(x34)
def dataclass_global_config(x):
    y = x * CFG.hidden
    for s in CFG.scales:
        y = y * s
    return torch.relu(y) if CFG.act == "relu" else y


@case(x34)
def closures_in_loop_capture_by_reference(x):
    fns = []
    for i in range(3):
        fns.append(lambda t, i=i: t * i)
    return [f(x) for f in fns]


@case(x34)
def string_keys_built_dynamically(x):
    out = {}
    for i, name in enumerate(["q", "k", "v"]):
        out[name.upper() + str(i)] = x * i
    return out


@case(lambda: ({"layers": [{"w": T(4, 4)}, {"w": T(4, 4)}]}, T(2, 4)))
def nested_param_tree(params, x):
    for layer in params["layers"]:
        x = x @ layer["w"]
    return x


class Counter:
    def __init__(self):
        self.n = 0

    def step(self, x):
        self.n += 1
        return x * self.n


@case(x34)
def object_created_and_mutated_inside(x):
    c = Counter()
    c.step(x)
    return c.step(x), c.n


@case(x34)
def kwonly_flag_selects_path(x, *, double=False):
    return x * 2 if double else x


@case(x34, kwargs=lambda: {"double": True})
def kwonly_flag_given(x, *, double=False):
    return x * 2 if double else x


@case(x34)
def tuple_comparisons_on_shapes(x):
    if x.shape == (3, 4) and x.shape[::-1] > (3, 3):
        return x.T
    return x


@case(x34)
def unpack_shape_into_view(x):
    return x.view(*x.shape[:-1], 2, 2), x.new_zeros(*x.shape)


@case(x34)
def list_of_shapes_and_zip(x):
    dims = list(x.shape)
    return [x.sum(d) for d, _ in zip(range(len(dims)), dims)]


@case(x34)
def nested_function_default_referencing_tensor(x):
    def inner(t, bias=x):
        return t + bias

    return inner(x * 2)


@case(x34)
def lambda_sorting_with_key_over_constants(x):
    order = sorted(["bb", "a", "ccc"], key=len) if False else sorted(["bb", "a", "ccc"])
    return x * len(order[0])


@case(x34)
def conditional_expression_chain(x):
    n = x.dim()
    kind = "vec" if n == 1 else "mat" if n == 2 else "ten"
    return {kind: x}


@case(x34)
def bool_ops_short_circuit_returning_values(x):
    a = None or x
    b = x if (0 and x) else x * 2
    return a, b


@case(lambda: (T(3, 4), None))
def none_argument_in_arithmetic_branch(x, maybe):
    return x if maybe is None else x + maybe


@case(x34)
def integer_ops_on_sizes(x):
    n, m = x.shape
    return x.reshape(n * m // 2, -1), n ** 2 % 5, -(-n // 2), n << 1, m >> 1, n & 1, n | 4, n ^ 7


class Scale:
    def __init__(self, factor):
        self.factor = factor
        self.active = False

    def __enter__(self):
        self.active = True
        return self.factor

    def __exit__(self, *exc):
        self.active = False
        return False


SCALE_CTX = Scale(3.0)


@case(x34)
def user_context_manager_created_inside(x):
    with Scale(2.0) as k:
        y = x * k
    return y


@case(x34)
def user_context_manager_global(x):
    with SCALE_CTX as k:
        y = x * k if SCALE_CTX.active else x
    return y, SCALE_CTX.active


@case(x34)
def global_tensor_constant(x):
    return x + _GLOBAL_BIAS


_GLOBAL_BIAS = torch.randn(4)
