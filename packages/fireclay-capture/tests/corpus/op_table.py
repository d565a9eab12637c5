"""A table of torch ops, each captured as a one-line function: torch functions, Tensor methods,
nn.functional, reductions and creation ops, over float and integer inputs."""

import torch
import torch.nn.functional as F

from corpus import Registry, T

CASES = Registry("op_table")

_UNARY_TORCH = ["abs", "acos", "asin", "atan", "ceil", "cos", "cosh", "erf", "exp", "expm1", "floor",
                "frac", "log1p", "neg", "reciprocal", "round", "rsqrt", "sigmoid", "sign", "sin", "sinh",
                "tan", "tanh", "trunc", "square", "logit", "deg2rad", "isnan", "isfinite", "signbit"]
for _name in _UNARY_TORCH:
    _fn = getattr(torch, _name)
    CASES.add(f"torch_{_name}", (lambda f: lambda x: f(x))(_fn), lambda: (T(3, 5),))

_METHODS = ["relu", "sqrt_", "exp", "log_softmax", "cumsum", "cumprod", "softmax", "argmax", "argmin",
            "amax", "amin", "logsumexp", "var", "std", "mean", "sum", "any", "all", "count_nonzero"]
_METHOD_ARGS = {"sqrt_": None, "log_softmax": (1,), "cumsum": (0,), "cumprod": (1,), "softmax": (-1,),
                "amax": (1,), "amin": (0,), "logsumexp": (1,), "any": (), "all": ()}
for _name in _METHODS:
    _args = _METHOD_ARGS.get(_name, ())
    if _name == "sqrt_":
        CASES.add("method_sqrt_inplace_on_clone", lambda x: x.abs().clone().sqrt_(), lambda: (T(4, 4),))
        continue
    CASES.add(f"method_{_name}", (lambda n, a: lambda x: getattr(x, n)(*a))(_name, _args), lambda: (T(4, 6),))

_BINARY = ["add", "sub", "mul", "div", "maximum", "minimum", "atan2", "hypot", "fmod", "remainder",
           "eq", "ne", "lt", "gt", "logical_and", "logical_xor", "copysign", "xlogy"]
for _name in _BINARY:
    _fn = getattr(torch, _name)
    CASES.add(f"binary_{_name}", (lambda f: lambda x, y: f(x, y))(_fn), lambda: (T(3, 4), T(3, 4)))

_FUNCTIONAL = {
    "hardtanh": (), "relu6": (), "selu": (), "celu": (), "softplus": (), "softsign": (), "tanhshrink": (),
    "hardswish": (), "hardsigmoid": (), "mish": (), "logsigmoid": (), "glu": (-1,), "softmin": (1,),
    "dropout": (0.0,), "normalize": (),
}
for _name, _args in _FUNCTIONAL.items():
    _fn = getattr(F, _name)
    CASES.add(f"functional_{_name}", (lambda f, a: lambda x: f(x, *a))(_fn, _args), lambda: (T(4, 6),))

_CREATION = {
    "zeros": lambda x: torch.zeros(2, 3) + x.sum(),
    "ones_dtype": lambda x: torch.ones(2, dtype=torch.int32) * 2,
    "full": lambda x: torch.full((2, 2), 1.5) * x[:2, :2],
    "arange_float": lambda x: torch.arange(0.0, 1.0, 0.25) + x[0, :4],
    "linspace": lambda x: torch.linspace(0, 1, 6) * x[0],
    "eye_like_rows": lambda x: torch.eye(x.shape[0]) @ x,
    "tensor_from_list": lambda x: torch.tensor([[1, 2], [3, 4]], dtype=torch.float32).sum() * x,
    "zeros_like_dtype": lambda x: torch.zeros_like(x, dtype=torch.int64),
    "empty_then_fill": lambda x: torch.empty(3).fill_(2.0),
    "scalar_tensor": lambda x: torch.scalar_tensor(3.0) * x,
}
for _name, _fn in _CREATION.items():
    CASES.add(f"create_{_name}", _fn, lambda: (T(4, 6),))

_SHAPE_OPS = {
    "squeeze_unsqueeze": lambda x: x.unsqueeze(1).squeeze(1),
    "movedim": lambda x: torch.movedim(x, 0, 2),
    "narrow": lambda x: x.narrow(1, 1, 2),
    "select": lambda x: x.select(2, 0),
    "index_select": lambda x: x.index_select(0, torch.tensor([1, 0])),
    "gather": lambda x: x.gather(2, torch.zeros(2, 3, 1, dtype=torch.long)),
    "masked_select_shape_free": lambda x: x.masked_fill(x > 0, 0.0),
    "tile": lambda x: x.tile((1, 2, 1)),
    "repeat_interleave_int": lambda x: x.repeat_interleave(2, dim=0),
    "split_sizes": lambda x: torch.split(x, [1, 2], dim=1),
    "tensor_split": lambda x: torch.tensor_split(x, 2, dim=2),
    "stack_unbind": lambda x: torch.stack(x.unbind(1), dim=0),
    "diagonal": lambda x: x.diagonal(dim1=1, dim2=2),
    "unfold": lambda x: x.unfold(2, 2, 1),
    "scatter_add": lambda x: torch.zeros(2, 3, 4).scatter_add(2, torch.zeros(2, 3, 4, dtype=torch.long), x),
    "clamp_min_max": lambda x: x.clamp(min=-0.1).clamp_max(0.2),
    "pad": lambda x: F.pad(x, (1, 1, 0, 2)),
    "interpolate": lambda x: F.interpolate(x, scale_factor=2, mode="nearest"),
    "one_hot": lambda x: F.one_hot(x.argmax(-1), 4),
    "outer_product": lambda x: torch.outer(x[0, 0], x[1, 1]),
}
for _name, _fn in _SHAPE_OPS.items():
    CASES.add(f"shape_{_name}", _fn, lambda: (T(2, 3, 4),))
