"""The cache of one code object: entries (guards + compiled callable + output spec), checked in
order on every call, with a limit on how many times the code may be re-captured."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from fireclay_capture.guards import CompiledGuards
from fireclay_capture.outputs import rebuild
from fireclay_ir import Program


@dataclass
class CacheEntry:
    """One capture: valid while ``guards`` pass. ``compiled`` is None for a frame that could not
    be captured and runs eagerly (its guards say when trying again could give another answer)."""

    guards: CompiledGuards
    compiled: Any
    out_spec: Any
    program: Program | None
    reason: str | None = None  # why the frame runs eagerly, for fallbacks
    replay: Any = None  # side_effects.Replay: changes to apply to real objects after the graph
    graph_break: Any = None  # a graph_break.BreakPlan when the capture stopped at a graph break
    owner: Any = None  # the CapturedFunction that runs the break's callees and resume functions

    def run(self, inputs: list, L: dict) -> Any:
        results = self.compiled(*inputs)
        if self.graph_break is not None:
            from fireclay_capture.graph_break import run_break

            inputs.clear()  # the rest of the function must not keep dead inputs alive
            return run_break(self.graph_break, self.owner, results, L)
        made: dict = {}
        # Read and rebuild everything before changing anything: the result may be read through
        # the objects that the replay changes.
        out = rebuild(self.out_spec, results, L, made)
        if self.replay is not None:
            self.replay.apply(self.replay.prepare(lambda spec: rebuild(spec, results, L, made), L))
        return out


@dataclass
class CaptureStats:
    captures: int = 0  # successful graph captures (each one a graph)
    recompiles: int = 0  # captures after the first, caused by a guard failure
    fallbacks: int = 0  # frames left to run eagerly
    cache_hits: int = 0
    calls: int = 0

    @property
    def graphs(self) -> int:
        return self.captures


@dataclass
class CodeCache:
    entries: list[CacheEntry] = field(default_factory=list)
    given_up: bool = False  # the recompile limit was reached: run eagerly from now on

    def lookup(self, L: dict) -> tuple[CacheEntry, list] | None:
        for entry in self.entries:
            inputs = entry.guards.fn(L)  # the generated function itself: one Python call less
            if inputs is not None:
                return entry, inputs
        return None
