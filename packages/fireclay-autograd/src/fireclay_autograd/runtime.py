"""Run compiled forward/backward callables as a ``torch.autograd.Function``.

The compiled halves are plain callables over tensors (whatever a backend produced). This
module restores eager semantics around them: outputs that do not require grad in eager are
marked non-differentiable, missing output gradients become zeros, mutated inputs are written
back once with ``copy_``, outputs that alias inputs are handed back as real views of those
inputs, and a second differentiation fails with a clear message.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from fireclay_autograd.convert import evaluate
from fireclay_autograd.functionalize import OutputAlias
from fireclay_ir.stages import tag

CompiledFn = Callable[..., Sequence[Any]]


class DoubleBackwardError(RuntimeError):
    """Raised when a graph compiled by fireclay-autograd is differentiated twice."""


@dataclass
class OutputPlan:
    """How the runtime turns the compiled graph's outputs into what the user gets."""

    num_user_outputs: int
    mutated_inputs: list[int] = field(default_factory=list)
    output_aliases: list[OutputAlias | None] = field(default_factory=list)
    num_intermediate_bases: int = 0
    # Trailing user outputs that are only bases for aliases of kind "output" (the training path
    # returns a base its outputs view when the base itself is not an output): not handed back.
    num_hidden_outputs: int = 0

    def finish(self, inputs: Sequence[Any], results: Sequence[Any], symbols: dict[str, int] | None = None) -> tuple:
        """Write mutations back into ``inputs`` and rebuild aliasing outputs (``symbols``: the
        values of the symbolic sizes in their view chains). The outputs are rebuilt before any
        input is written, so that a failure here leaves the caller's tensors as they were (and
        the call can be run again another way)."""
        n, m = self.num_user_outputs, len(self.mutated_inputs)
        if not m and not self.num_hidden_outputs and self.output_aliases.count(None) == len(self.output_aliases):
            return tuple(results[:n])  # nothing to write back or rebuild: the common case, per call
        try:
            user = list(results[:n])
            bases = results[n + m:n + m + self.num_intermediate_bases]
            # Views of other outputs come last, so that they view what the user gets. Views are
            # metadata only: an input viewed here sees the write-back below.
            for i, alias in sorted(enumerate(self.output_aliases),
                                   key=lambda p: p[1] is not None and p[1].kind == "output"):
                if alias is None:
                    continue
                x = {"input": inputs, "intermediate": bases, "output": user}[alias.kind][alias.index]
                for step in alias.chain:
                    x = step.apply(x, symbols)
                user[i] = x
            if m:
                with torch.no_grad():
                    for index, new in zip(self.mutated_inputs, results[n:n + m]):
                        inputs[index].copy_(new)
            return tuple(user[:n - self.num_hidden_outputs])
        except Exception as exc:
            raise tag(exc, "runtime plan") from None


@dataclass
class InferenceRuntime:
    """The no-autograd path: one compiled graph, then write-back and aliasing."""

    forward: CompiledFn
    plan: OutputPlan
    constants: list[torch.Tensor]
    carriers: list[SizeCarrier] = field(default_factory=list)

    def __call__(self, *inputs: Any, symbols: dict[str, int] | None = None) -> tuple:
        results = self.forward(*inputs, *self.constants, *carry(self.carriers, symbols))
        return self.plan.finish(inputs, results, symbols)


@dataclass
class TrainingRuntime:
    """The autograd path: compiled forward and backward joined by :class:`CompiledFunction`.

    ``forward`` returns the user outputs, the new values of mutated inputs, then the saved
    tensors. ``backward`` takes the saved tensors then one tangent per ``tangent_outputs``
    entry and returns one gradient per ``grad_inputs`` entry.
    """

    forward: CompiledFn
    backward: CompiledFn
    plan: OutputPlan
    constants: list[torch.Tensor]
    num_saved: int
    tangent_outputs: list[int]
    grad_inputs: list[int]
    tangent_metas: list[tuple[Sequence[Any], torch.dtype, torch.device]] = field(default_factory=list)
    fw_carriers: list[SizeCarrier] = field(default_factory=list)
    bw_carriers: list[SizeCarrier] = field(default_factory=list)

    def __call__(self, *inputs: Any, symbols: dict[str, int] | None = None) -> tuple:
        results = CompiledFunction.apply(self, symbols, *inputs, *self.constants, *carry(self.fw_carriers, symbols))
        return self.plan.finish(inputs, results, symbols)


@dataclass(frozen=True)
class SizeCarrier:
    """An extra graph input whose only dim is symbol ``symbol``: a compiled graph reads its
    symbolic sizes off its inputs' shapes, and this hands it a size no other input shows."""

    symbol: str
    device: str


def carry(carriers: list[SizeCarrier], symbols: dict[str, int] | None) -> list[torch.Tensor]:
    if not carriers:
        return []
    if symbols is None:
        raise RuntimeError("a graph with symbolic sizes was called without their values")
    return [torch.empty(symbols[c.symbol], dtype=torch.uint8, device=c.device) for c in carriers]


class CompiledFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, runtime: TrainingRuntime, symbols: dict[str, int] | None, *inputs: Any):
        results = list(runtime.forward(*inputs))
        n_out = runtime.plan.num_user_outputs + len(runtime.plan.mutated_inputs)
        outputs, saved = results[:n_out], results[n_out:]
        if len(saved) != runtime.num_saved:
            raise RuntimeError(f"the compiled forward returned {len(saved)} saved tensors, expected {runtime.num_saved}")
        ctx.runtime = runtime
        ctx.symbols = symbols
        ctx.save_for_backward(*saved)
        differentiable = set(runtime.tangent_outputs)
        # A compiled graph may return one tensor at several positions; autograd would then see
        # only its last position. Later positions get their own tensor object (same storage).
        seen: set[int] = set()
        for i, o in enumerate(outputs):
            if isinstance(o, torch.Tensor):
                if id(o) in seen:
                    outputs[i] = o.detach()
                seen.add(id(o))
        ctx.mark_non_differentiable(*[o for i, o in enumerate(outputs)
                                      if isinstance(o, torch.Tensor) and i not in differentiable])
        ctx.set_materialize_grads(False)
        return tuple(outputs)

    @staticmethod
    def backward(ctx, *grad_outputs: Any):
        if torch.is_grad_enabled():
            raise DoubleBackwardError(
                "double backward (create_graph=True, or a gradient of a gradient) through a graph "
                "compiled by fireclay-autograd is not supported; compute higher-order gradients "
                "eagerly, outside the compiled region")
        runtime: TrainingRuntime = ctx.runtime
        tangents = []
        for k, i in enumerate(runtime.tangent_outputs):
            g = grad_outputs[i]
            if g is None:
                shape, dtype, device = runtime.tangent_metas[k]
                shape = [evaluate(d, ctx.symbols or {}) for d in shape]
                g = torch.zeros(shape, dtype=dtype, device=device)
            tangents.append(g.contiguous())
        grads = list(runtime.backward(*ctx.saved_tensors, *tangents, *carry(runtime.bw_carriers, ctx.symbols)))
        n_inputs = ctx.needs_input_grad.__len__() - 2
        result: list[Any] = [None] * n_inputs
        for index, g in zip(runtime.grad_inputs, grads):
            result[index] = g
        return (None, None, *result)
