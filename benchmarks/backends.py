"""The backend table: backend name -> how to make a compiled callable from a model.

    eager            the model itself (the oracle and the speed baseline)
    inductor         torch.compile(model): TorchDynamo + AOTAutograd + Inductor, torch's own stack
    torch-NAME       torch.compile(model, backend="NAME"), any registered TorchDynamo backend
                     (torch-aot_eager, torch-eager, ...): baselines for each fireclay stage
    fireclay         fireclay.compile(model), the default fireclay pipeline
    fireclay-NAME    fireclay.compile(model, backend="NAME") (fireclay-eager, fireclay-inductor, ...)
    dynamo-fireclay  torch.compile(model, backend="fireclay"): torch's capture, fireclay's stages
    NAME@MODE        any of the compiled backends with mode=MODE (inductor@reduce-overhead,
                     fireclay@max-autotune, ...)

A backend that cannot run here (fireclay.compile not written yet, no such dynamo backend) is
reported per cell as "unavailable" with the reason; it never stops a run.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass

import torch

from benchmarks.models import Inputs


@dataclass(frozen=True)
class GraphCounts:
    graphs: int | None
    breaks: int | None


@dataclass(frozen=True)
class Backend:
    """One column of the benchmark.

    `unavailable()` gives the reason the backend cannot run here, or None. `compile(model)` returns
    the callable to run (it may compile lazily, on its first call). `reset()` forgets every
    compiled artifact held in memory, so that the next compile is a "warm" one: in-process state
    gone, on-disk caches kept. `start_counting()` / `counts(...)` give graph and break counts of the
    compiles since the last `start_counting()`. `cache_env` names the environment variables that
    point the backend's on-disk caches somewhere, for the cold-compile measurement.
    `wait_compiled()` blocks while the backend compiles in the background (fireclay runs CUDA
    graphs in its interpreter meanwhile) and returns how many graphs started compiling since its
    last call: each switches to its compiled code at its next call (0: nothing new; see
    `measure.run_until_compiled`).
    """

    name: str
    unavailable: Callable[[], str | None]
    compile: Callable[[torch.nn.Module], Callable]
    reset: Callable[[], None] = lambda: None
    start_counting: Callable[[], None] = lambda: None
    counts: Callable[[torch.nn.Module, Inputs], GraphCounts] = lambda model, inputs: GraphCounts(None, None)
    cache_env: tuple[str, ...] = ()
    wait_compiled: Callable[[], int] = lambda: 0

    @property
    def is_eager(self) -> bool:
        return self.name == "eager"


# On-disk caches of torch's stack (Triton's own cache is pointed inside Inductor's as well).
TORCH_CACHE_ENV = ("TORCHINDUCTOR_CACHE_DIR", "TRITON_CACHE_DIR")
FIRECLAY_CACHE_ENV = ("FIRECLAY_CACHE_DIR",)
ALL_CACHE_ENV = TORCH_CACHE_ENV + FIRECLAY_CACHE_ENV


def _eager() -> Backend:
    return Backend("eager", unavailable=lambda: None, compile=lambda model: model)


def _dynamo_reset() -> None:
    import torch._dynamo

    torch._dynamo.reset()


def _dynamo_start_counting() -> None:
    from torch._dynamo.utils import counters

    counters.clear()


def _dynamo_counts(model, inputs) -> GraphCounts:
    from torch._dynamo.utils import counters

    # unique_graphs counts every graph Dynamo handed to the backend; graph_break holds one entry
    # per distinct break reason with the number of times it was hit.
    return GraphCounts(int(counters["stats"]["unique_graphs"]), int(sum(counters["graph_break"].values())))


def _fireclay_wait_compiled() -> int:
    wait = getattr(_fireclay_module(), "wait_compiled", None)
    return int(wait()) if callable(wait) else 0


def _torch_compile(name: str, dynamo_backend: str, mode: str | None = None) -> Backend:
    def unavailable() -> str | None:
        import torch._dynamo

        if dynamo_backend not in torch._dynamo.list_backends(exclude_tags=()):
            return f"torch.compile has no backend named {dynamo_backend!r} in this environment"
        return None

    return Backend(name, unavailable=unavailable,
                   compile=lambda model: torch.compile(model, backend=dynamo_backend, mode=mode),
                   reset=_dynamo_reset, start_counting=_dynamo_start_counting, counts=_dynamo_counts,
                   cache_env=ALL_CACHE_ENV,
                   # torch.compile(backend="fireclay") runs fireclay's backend, background compiles included
                   wait_compiled=_fireclay_wait_compiled if dynamo_backend.startswith("fireclay") else lambda: 0)


def _fireclay_module():
    return importlib.import_module("fireclay")


def _fireclay(name: str, variant: str | None, mode: str | None = None) -> Backend:
    def unavailable() -> str | None:
        try:
            fireclay = _fireclay_module()
        except ImportError as error:
            return f"fireclay does not import: {error}"
        if not callable(getattr(fireclay, "compile", None)):
            return "not available yet (fireclay.compile does not exist)"
        list_backends = getattr(fireclay, "list_backends", None)
        if variant is not None and callable(list_backends) and variant not in list_backends():
            return f"fireclay has no backend named {variant!r} (fireclay.list_backends(): {list_backends()})"
        return None

    def compile(model):
        fireclay = _fireclay_module()
        if variant is None:
            return fireclay.compile(model, mode=mode)
        return fireclay.compile(model, backend=variant, mode=mode)

    def reset() -> None:
        reset_fn = getattr(_fireclay_module(), "reset", None)
        if callable(reset_fn):
            reset_fn()

    def counts(model, inputs) -> GraphCounts:
        explain = getattr(_fireclay_module(), "explain", None)
        if not callable(explain):
            return GraphCounts(None, None)
        # fireclay.explain follows torch._dynamo.explain: explain(fn)(*args, **kwargs) returns a
        # report with graph_count and graph_break_count (or break_count).
        report = explain(model)(*inputs.args, **inputs.kwargs)
        breaks = getattr(report, "graph_break_count", getattr(report, "break_count", None))
        return GraphCounts(getattr(report, "graph_count", None), breaks)

    return Backend(name, unavailable=unavailable, compile=compile, reset=reset, counts=counts,
                   cache_env=FIRECLAY_CACHE_ENV + TORCH_CACHE_ENV, wait_compiled=_fireclay_wait_compiled)


def get_backend(name: str) -> Backend:
    """The backend called `name` (see the module docstring for the names understood)."""
    base, _, mode = name.partition("@")
    mode = mode or None
    if base == "eager" and mode is None:
        return _eager()
    if base == "inductor":
        return _torch_compile(name, "inductor", mode)
    if base.startswith("torch-") and len(base) > len("torch-"):
        return _torch_compile(name, base[len("torch-"):], mode)
    if base == "dynamo-fireclay":
        return _torch_compile(name, "fireclay", mode)
    if base == "fireclay":
        return _fireclay(name, None, mode)
    if base.startswith("fireclay-") and len(base) > len("fireclay-"):
        return _fireclay(name, base[len("fireclay-"):], mode)
    raise KeyError(f"unknown backend {name!r}: use eager, inductor, torch-<dynamo backend>, fireclay, "
                   "fireclay-<fireclay backend> or dynamo-fireclay, each optionally with @<mode>")
