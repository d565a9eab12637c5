"""What library helpers (transformers 5.x decorators, torch.nn utilities) do around the tensor
code: id() of modules and configs, functorch-state queries, ATen and custom op packets, logging
and warnings, modules built in forward, deep copies of configs, weight-norm parametrizations and
lru_cache-wrapped queries. Each captures in one graph, as under TorchDynamo."""

import copy
import dataclasses
import functools
import logging
import warnings

import torch

from corpus import Registry, T

CASES = Registry("library")
case = CASES
x34 = lambda: (T(3, 4),)

_LINEAR = torch.nn.Linear(4, 4)


@case(x34)
def id_of_module_from_before_the_frame(x):
    # can_return_tuple / output-capturing helpers key tables by id(module)
    scales = {id(_LINEAR): 2.0}
    return _LINEAR(x) * scales[id(_LINEAR)]


@dataclasses.dataclass
class _Config:
    scale: float = 1.5
    use_bias: bool = True
    names: tuple = ("a", "b")


_CONFIG = _Config()


@case(x34)
def id_of_config_object(x):
    seen = {id(_CONFIG): _CONFIG}
    return x * seen[id(_CONFIG)].scale


@case(x34)
def id_of_values_made_in_the_trace(x):
    a, b = [], []
    table = {id(a): 1.0, id(b): 2.0}
    same = id(a) == id(a)
    different = id(a) != id(b)
    return x * table[id(b)] + same + different


@case(x34)
def functorch_state_query(x):
    if torch._C._are_functorch_transforms_active():
        return x - 1
    return x + 1


@case(x34)
def aten_op_packets_and_overloads(x):
    return torch.ops.aten.add.Tensor(x, x) + torch.ops.aten.mul(x, 2) - torch.ops.aten.sin.default(x)


@torch.library.custom_op("fireclay_corpus::scaled", mutates_args=())
def _scaled(x: torch.Tensor, factor: float) -> torch.Tensor:
    return x * factor


@_scaled.register_fake
def _(x, factor):
    return torch.empty_like(x)


@case(x34)
def custom_op_through_torch_ops(x):
    # what transformers' MoE fallback does: torch.ops.<namespace>.<op>(...)
    return torch.ops.fireclay_corpus.scaled(x, 3.0) + 1


class _OnceLogger(logging.Logger):
    """A logger with transformers' lru_cache-wrapped ``warning_once``."""

    @functools.lru_cache(None)  # noqa: B019 - the cache is the point: one message per text
    def warning_once(self, *args, **kwargs):
        self.warning(*args, **kwargs)


_LOG = _OnceLogger("fireclay_corpus.library")
_LOG.addHandler(logging.NullHandler())
_LOG.propagate = False


@case(x34)
def logging_calls_inside_the_function(x):
    _LOG.warning("scaling %s by %d", "x", 2)
    _LOG.warning_once("said once")
    _LOG.info("shape %s", x.shape)
    return x * 2


@case(x34)
def warnings_warn_inside_the_function(x):
    warnings.warn("a note from inside the captured function", UserWarning, stacklevel=1)
    return x + 1


def _warn_and_scale(x):
    warnings.warn("deprecated argument", FutureWarning, stacklevel=2)
    return x * 3


@case(x34)
def warnings_warn_in_a_called_function(x):
    return _warn_and_scale(x) - 1


@case(lambda: (T(2, 3, 8),))
def module_built_inside_forward(x):
    pooled = torch.nn.MaxPool1d(2)(x)
    return torch.nn.ReLU()(pooled) + torch.nn.Flatten(1)(x).sum(1, keepdim=True).unsqueeze(-1)


@case(x34)
def deepcopy_of_a_config_then_changed(x):
    local = copy.deepcopy(_CONFIG)
    local.scale = local.scale * 2
    del local.use_bias
    return x * local.scale + _CONFIG.scale + len(local.names) + hasattr(local, "use_bias")


_WEIGHT_NORMED = torch.nn.utils.parametrizations.weight_norm(torch.nn.Conv1d(3, 4, 3), dim=2)


@case(lambda: (T(2, 3, 8),))
def weight_norm_parametrization(x):
    return _WEIGHT_NORMED(x)


@functools.lru_cache(None)
def _library_available():
    return True


@case(x34)
def lru_cached_query(x):
    if _library_available():
        return x * 2
    return x
