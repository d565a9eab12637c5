"""Private torch callables that TorchDynamo leaves in its graphs, and the public torch-dialect
calls they stand for.

TorchDynamo traces into ``torch.nn.functional``'s Python wrappers and records the C function
each one calls (``torch._C._nn.pad``, ``torch._C._nn.cross_entropy_loss``). Those are not
reachable from the dialect's public roots, so a graph holding them is recorded as the public
wrapper instead, its arguments rewritten to the wrapper's keywords (the loss functions' integer
reduction becomes the wrapper's string).
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass, field
from typing import Any

# torch's reduction enum (torch.nn._reduction.get_enum), by value
_REDUCTIONS = ("none", "mean", "sum")


@dataclass(frozen=True, kw_only=True)
class PublicForm:
    """How one private C function is written as a public ``torch.nn.functional`` call."""

    name: str  # the torch-dialect name of the public function
    params: tuple[str, ...]  # the private function's parameters, in order (first: the input)
    renamed: dict[str, str] = field(default_factory=dict)  # private parameter -> public keyword

    def arguments(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[tuple[Any, ...], dict[str, Any]]:
        if len(args) > len(self.params):
            raise ValueError(f"{len(args)} arguments for {self.name}, which takes {len(self.params)}")
        bound = dict(zip(self.params, args))
        bound.update(kwargs)
        if isinstance(bound.get("reduction"), int) and not isinstance(bound["reduction"], bool):
            bound["reduction"] = _REDUCTIONS[bound["reduction"]]
        first = bound.pop(self.params[0])
        return (first,), {self.renamed.get(k, k): v for k, v in bound.items()}


def _form(public: str, *params: str, **renamed: str) -> PublicForm:
    return PublicForm(name=f"torch.nn.functional.{public}", params=("input", *params), renamed=renamed)


# torch._C._nn.<name> -> its public form
_NN_FORMS: dict[str, PublicForm] = {
    "pad": _form("pad", "pad", "mode", "value"),
    "cross_entropy_loss": _form("cross_entropy", "target", "weight", "reduction", "ignore_index",
                                "label_smoothing"),
    "nll_loss": _form("nll_loss", "target", "weight", "reduction", "ignore_index"),
    "nll_loss_nd": _form("nll_loss", "target", "weight", "reduction", "ignore_index"),
    "nll_loss2d": _form("nll_loss", "target", "weight", "reduction", "ignore_index"),
    "mse_loss": _form("mse_loss", "target", "reduction"),
    "l1_loss": _form("l1_loss", "target", "reduction"),
    "soft_margin_loss": _form("soft_margin_loss", "target", "reduction"),
    "smooth_l1_loss": _form("smooth_l1_loss", "target", "reduction", "beta"),
    "huber_loss": _form("huber_loss", "target", "reduction", "delta"),
    "binary_cross_entropy": _form("binary_cross_entropy", "target", "weight", "reduction"),
    "silu": _form("silu"),
    "relu6": _form("relu6"),
    "hardsigmoid": _form("hardsigmoid"),
    "hardswish": _form("hardswish"),
    "mish": _form("mish"),
    "log_sigmoid": _form("logsigmoid"),
    "hardtanh": _form("hardtanh", "min_val", "max_val"),
    "leaky_relu": _form("leaky_relu", "negative_slope"),
    "glu": _form("glu", "dim"),
}


def public_form(target: Any) -> PublicForm | None:
    """The public form of ``target`` when it is one of the private C functions above."""
    name = getattr(target, "__name__", None)
    form = _NN_FORMS.get(name) if isinstance(name, str) else None
    if form is None or not isinstance(name, str):
        return None
    nn = importlib.import_module("torch._C._nn")
    return form if getattr(nn, name, None) is target else None
