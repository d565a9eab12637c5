"""What a model of the suite is: its spec, the built module, and its inputs."""

from __future__ import annotations

import importlib.util
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

# Model sizes, smallest first: every size table of the suite has one entry per preset.
PRESETS = ("small", "medium", "large")


class ModelUnavailable(Exception):
    """The model cannot be built here (a library it needs is not installed)."""


@dataclass
class Inputs:
    """Positional and keyword arguments for one call of a model."""

    args: tuple = ()
    kwargs: dict[str, Any] = field(default_factory=dict)

    def to(self, device: str | torch.device, dtype: torch.dtype | None = None) -> Inputs:
        """Move every tensor to `device`; floating tensors also to `dtype` when one is given."""

        def move(value):
            if isinstance(value, torch.Tensor):
                if dtype is not None and value.is_floating_point():
                    return value.to(device=device, dtype=dtype)
                return value.to(device)
            return value

        return Inputs(tuple(move(a) for a in self.args), {k: move(v) for k, v in self.kwargs.items()})


# (seed, tiny) -> Inputs on the CPU. `tiny` asks for the smallest sensible call (batch 1, a few
# tokens): it measures per-call overhead, where the framework's own work dominates.
InputFactory = Callable[[int, bool], Inputs]


@dataclass
class BuiltModel:
    module: torch.nn.Module
    make_inputs: InputFactory

    def inputs(self, seed: int, device: str | torch.device = "cpu", tiny: bool = False) -> Inputs:
        return self.make_inputs(seed, tiny).to(device)


@dataclass(frozen=True)
class ModelSpec:
    """One model of the suite.

    `build(preset)` returns the module with weights drawn from a fixed seed, so that two builds
    give identical models. `requires` names the importable libraries the model needs; without them
    the model is reported as unavailable, never as failed. `tolerance` is the largest relative
    error (max |a - b| over max |b|, per tensor) accepted against eager in float32.
    """

    name: str
    family: str
    build_fn: Callable[[str], BuiltModel]
    requires: tuple[str, ...] = ()
    tolerance: float = 1e-3
    description: str = ""

    def missing(self) -> list[str]:
        return [lib for lib in self.requires if importlib.util.find_spec(lib) is None]

    def build(self, preset: str) -> BuiltModel:
        if preset not in PRESETS:
            raise ValueError(f"unknown preset {preset!r}; use one of {PRESETS}")
        missing = self.missing()
        if missing:
            raise ModelUnavailable(f"{self.name} needs {', '.join(missing)} (not installed)")
        # Weights depend only on the model and preset, never on what ran before.
        torch.manual_seed(0)
        return self.build_fn(preset)
