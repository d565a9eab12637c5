"""``config.verify_correctness``: run the reference interpreter beside every compiled call.
(Falling back when a stage fails is :mod:`fireclay.fallback`; its names stay importable here.)"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable
from typing import Any

import torch

from fireclay.config import config
from fireclay.fallback import BackendCompilerFailed, first_source
from fireclay.fallback import guarded_backend as falling_back
from fireclay_ir import Program, Weight, interpret

__all__ = ["BackendCompilerFailed", "CorrectnessError", "falling_back", "first_source", "verifying"]

log = logging.getLogger("fireclay")


class CorrectnessError(AssertionError):
    """A compiled call's result differs from the reference interpreter's."""


def _clone(x: Any) -> Any:
    return x.detach().clone() if isinstance(x, torch.Tensor) else x


def verifying(backend: Callable[..., Any], name: str) -> Callable[..., Any]:
    """Wrap ``backend`` so that, while ``config.verify_correctness`` is on, each call also runs the
    captured program in the interpreter (on copies of the inputs and weights, so mutations happen
    once) and compares the results."""

    def compile_verified(program: Program, example_inputs: list) -> Callable[..., Any]:
        compiled = backend(program, example_inputs)

        def run(*inputs: Any) -> Any:
            if not config.verify_correctness:
                return compiled(*inputs)
            shadow = dataclasses.replace(
                program, weights={k: Weight(w.meta, _clone(w.data)) for k, w in program.weights.items()})
            with torch.no_grad():
                expected = interpret(shadow, *[_clone(x) for x in inputs])
            actual = compiled(*inputs)
            _compare(actual, expected, name)
            return actual

        return run

    return compile_verified


def _compare(actual: Any, expected: Any, name: str) -> None:
    actual, expected = list(actual), list(expected)
    if len(actual) != len(expected):
        raise CorrectnessError(f"backend {name!r} returned {len(actual)} outputs, the reference {len(expected)}")
    for i, (a, e) in enumerate(zip(actual, expected)):
        if isinstance(e, torch.Tensor):
            try:
                torch.testing.assert_close(a, e, rtol=config.verify_rtol, atol=config.verify_atol,
                                           check_device=True, check_dtype=True)
            except AssertionError as exc:
                raise CorrectnessError(f"backend {name!r}, output {i}: {exc}") from None
        elif a != e:
            raise CorrectnessError(f"backend {name!r}, output {i}: {a!r} != reference {e!r}")
