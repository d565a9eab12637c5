"""What a value may ask of the capture in progress: the :class:`TraceState` protocol.

Variables (``variables/``), the builtin rules and ``cond`` model Python values. To record a graph
node, wrap a value read from outside the trace, inline a call, note a mutation or record a change
to be replayed, they go through the trace they are handed (``tx``), typed as this protocol. The
tracer implements it. This module sits below the variables, so that they depend on it instead of
on the tracer, the value builder, the builtin rules or the interpreter (which all sit above).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    import torch

    from fireclay_capture.aliases import AliasTable
    from fireclay_capture.dynamic import ShapeSession
    from fireclay_capture.guards import GuardSet
    from fireclay_capture.side_effects import SideEffects
    from fireclay_capture.sources import Source
    from fireclay_capture.variables.base import CellVar, Var
    from fireclay_ir import Graph


class TraceState(Protocol):
    """One capture in progress, as the values being traced see it."""

    graph: Graph  # the graph being built
    guards: GuardSet  # what the trace assumed about its inputs
    aliases: AliasTable  # which sources name the same object
    shapes: ShapeSession | None  # symbolic shapes, when some input dim is dynamic
    side_effects: SideEffects  # changes to outside objects, replayed after the graph
    subgraphs: list[Graph]  # branches of hop::cond nodes
    call_log: list | None  # the torch calls recorded while a vmapped function is traced (vmap.py)
    function_modes: list[str]  # torch function modes entered in the trace, innermost last
    frames: list[Any]  # the interpreter frames: the root first, the innermost inlined call last
    entered_contexts: list[Any]  # real context managers to leave if the trace fails
    mutated: list[Any]  # what each change made inside the trace changed (None where it names nothing)

    @property
    def mutations(self) -> int:
        """Changes to lists, dicts, objects and cells made inside the trace, counted so that a
        graph break inside an inlined call knows whether the callee changed state the caller
        can see."""
        ...

    # -- values read from outside the trace
    def wrap(self, value: Any, source: Source | None, *, weight: tuple[str, str] | None = None,
             qualname: str | None = None) -> Var:
        """A Var for ``value``; with a source, also the guards that pin what the trace relies on."""
        ...

    def wrap_container(self, value: Any, source: Source | None) -> Var:
        """A dict/list/tuple subclass instance viewed as the plain container."""
        ...

    def tensor_input(self, value: torch.Tensor, source: Source, weight: tuple[str, str] | None) -> Var: ...

    def cell_var(self, cell: Any, source: Source) -> CellVar: ...

    def qualname_of(self, module: torch.nn.Module) -> str | None: ...

    # -- calls
    def inline_call(self, fn: Var, args: list[Var], kwargs: dict[str, Var]) -> Var: ...

    def call_builtin(self, fn: Any, args: list[Var], kwargs: dict[str, Var]) -> Var:
        """A builtin (``len``, ``isinstance``, ``math.sqrt``...) applied to traced values."""
        ...

    # -- state the graph or the replay must reproduce
    def note_mutation(self, var: Any = None) -> None: ...

    def new_cell(self, contents: Any = ...) -> CellVar:
        """A closure cell made inside the trace (MAKE_CELL), numbered in order."""
        ...

    def set_grad_enabled(self, enabled: bool) -> None: ...

    def write_attr(self, obj: Any, source: Source | None, name: str, value: Any) -> None: ...

    def read_attr(self, obj: Any, name: str) -> Any: ...

    # -- where the trace is in the user's code
    def location(self, frame: Any = None) -> dict[str, Any] | None: ...

    def node_meta(self) -> dict[str, Any]: ...

    def in_module(self, qualname: str, type_name: str) -> contextlib.AbstractContextManager[None]: ...


class BreakSpecs(Protocol):
    """What a value's ``reconstruct()`` may use to describe itself when a graph break is planned:
    the spec of another value, graph outputs, and objects that must come out as one object."""

    def spec_of(self, value: Var) -> Any:
        """The spec of ``value`` (its ``reconstruct()``, or NULL for the interpreter's NULL)."""
        ...

    def output(self, value: Var) -> Any:
        """A graph output, the value read again from its source, or an object made in the trace."""
        ...

    def shared(self, value: Var, build: Callable[[], Any]) -> Any:
        """The one spec of a mutable container that several places may reach: ``build()`` runs
        once, after the container is known (so a container that holds itself works)."""
        ...

    def cell(self, cell: CellVar) -> Any:
        """The spec of a closure cell, one per cell."""
        ...


__all__ = ["BreakSpecs", "TraceState"]
