"""fireclay's configuration: one typed object, environment overrides, and ``patch``.

Every knob is a field of :class:`Config` with a default. An environment variable
``FIRECLAY_<FIELD NAME IN CAPITALS>`` overrides the default when the module is imported (and when
:func:`reload_from_environment` is called). ``config.patch(...)`` changes knobs for the duration
of a ``with`` block or of a decorated function, and restores them afterwards.

    import fireclay
    fireclay.config.recompile_limit = 16
    with fireclay.config.patch(verify_correctness=True):
        ...
"""

from __future__ import annotations

import contextlib
import dataclasses
import importlib
import os
import sys
from typing import Any


@dataclasses.dataclass
class Config:
    # Capture: how many times one code object may be re-captured before it runs eagerly.
    recompile_limit: int = 8
    # Log captures, recompiles (with the failing guard), graph breaks and perf hints at INFO on
    # stderr: FIRECLAY_LOG="capture,recompiles,graph_breaks,perf_hints" (FIRECLAY_LOG does more).
    verbose: bool = False
    # Sizes start static; a dimension becomes symbolic only when marked or after it changes.
    assume_static_by_default: bool = True
    # After a recompile caused by a size change, re-capture with that dimension symbolic.
    automatic_dynamic_shapes: bool = True
    # Replay side effects (attribute, global and container mutation) recorded during capture.
    replay_side_effects: bool = True
    # Run eager beside every compiled call and raise if the results differ.
    verify_correctness: bool = False
    # Relative/absolute tolerance used by verify_correctness.
    verify_rtol: float = 1e-4
    verify_atol: float = 1e-5
    # Where compiled artifacts are cached across processes (FIRECLAY_CACHE_DIR; "" = the user's
    # cache folder, $XDG_CACHE_HOME/fireclay or ~/.cache/fireclay: fireclay_loops.cache_dirs).
    # fireclay-cpp's libraries go in its cpp/ folder, the stages' artifacts in artifacts/; a
    # folder another user could write is not used (one warning; the compile goes on without it).
    cache_dir: str = ""
    # Reuse the autograd and loops stages' artifacts from cache_dir across processes.
    compile_cache: bool = True
    # Write every stage's program (captured, aten, loops) and the generated kernels and wrapper of
    # each graph the fireclay backend compiles under this folder, one folder per graph ("" = off).
    debug_dir: str = ""
    # Verify the IR at every stage boundary (slower; for debugging the compiler).
    verify_ir: bool = False
    # CUDA graphs of the fireclay backend: compile the Triton kernels in the background and run
    # the graph in the interpreter until they are ready (off under mode="reduce-overhead", whose
    # CUDA graphs must record compiled kernels). fireclay.wait_compiled() waits for them.
    background_compile: bool = True
    # On a terminal (stderr a tty, no CI variable), show which graph and stage a compile is in once
    # it has taken longer than 2 s (fireclay.stages).
    show_progress: bool = True
    # Under DistributedDataParallel, cut each captured graph at DDP's gradient bucket boundaries
    # and compile the pieces separately, so a bucket's all-reduce starts while the backward of
    # the earlier pieces still runs (TorchDynamo's DDPOptimizer).
    optimize_ddp: bool = True

    def patch(self, **changes: Any) -> _Patch:
        """Set knobs temporarily; usable as ``with config.patch(...)`` and ``@config.patch(...)``."""
        for name in changes:
            if name not in _FIELDS:
                raise AttributeError(_unknown(name))
        return _Patch(self, changes)

    def write_through(self) -> None:
        """Hand the knobs a stage reads from its own config module to that module."""
        for name, (module, attr) in _STAGE_KNOBS.items():
            setattr(importlib.import_module(module), attr, getattr(self, name))

    def as_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def __setattr__(self, name: str, value: Any) -> None:
        if name not in _FIELDS:
            raise AttributeError(_unknown(name))
        value = _check(name, value)
        super().__setattr__(name, value)
        if name in _STAGE_KNOBS:
            module, attr = _STAGE_KNOBS[name]
            # A stage not imported yet gets every knob when it is (write_through), so that
            # importing fireclay (the CLI's --help) does not import the stages and torch.
            if module in sys.modules:
                setattr(sys.modules[module], attr, value)
        if name == "verbose":
            importlib.import_module("fireclay.logs").set_verbose(value)


_FIELDS = {f.name: f for f in dataclasses.fields(Config)}

# Knobs that a stage reads from its own config module: setting them here writes through, so a
# stage used alone and the same stage under fireclay.compile read one value.
_STAGE_KNOBS: dict[str, tuple[str, str]] = {
    "recompile_limit": ("fireclay_capture.config", "recompile_limit"),
    "automatic_dynamic_shapes": ("fireclay_capture.config", "automatic_dynamic"),
    "replay_side_effects": ("fireclay_capture.config", "replay_side_effects"),
}


def _unknown(name: str) -> str:
    return f"fireclay.config has no knob {name!r}; knobs are: {', '.join(sorted(_FIELDS))}"


def _parse(name: str, raw: str) -> Any:
    """The value of an environment variable, as the knob's type."""
    kind = _FIELDS[name].type
    if kind == "bool":
        lowered = raw.strip().lower()
        if lowered in ("1", "true", "yes", "on"):
            return True
        if lowered in ("0", "false", "no", "off", ""):
            return False
        raise ValueError(f"expected a boolean (1/0, true/false), got {raw!r}")
    try:
        return {"int": int, "float": float, "str": str}[kind](raw)
    except ValueError:
        raise ValueError(f"expected {kind}, got {raw!r}") from None


def _check(name: str, value: Any) -> Any:
    kind = _FIELDS[name].type
    expected = {"bool": bool, "int": int, "float": (int, float), "str": str}[kind]
    if not isinstance(value, expected) or (kind == "int" and isinstance(value, bool)):
        raise TypeError(f"fireclay.config.{name} expects {kind}, got {value!r}")
    return value


class _Patch(contextlib.ContextDecorator):
    def __init__(self, config: Config, changes: dict[str, Any]):
        self.config = config
        self.changes = changes
        self.saved: list[dict[str, Any]] = []

    def __enter__(self) -> Config:
        self.saved.append({name: getattr(self.config, name) for name in self.changes})
        for name, value in self.changes.items():
            setattr(self.config, name, value)
        return self.config

    def __exit__(self, *exc: Any) -> None:
        for name, value in self.saved.pop().items():
            setattr(self.config, name, value)


def environment_variable(name: str) -> str:
    return f"FIRECLAY_{name.upper()}"


def reload_from_environment(config: Config) -> Config:
    """Apply ``FIRECLAY_*`` environment variables to ``config``."""
    for name in _FIELDS:
        raw = os.environ.get(environment_variable(name))
        if raw is not None:
            try:
                setattr(config, name, _parse(name, raw))
            except ValueError as exc:
                raise ValueError(f"environment variable {environment_variable(name)}: {exc}") from None
    return config


config = reload_from_environment(Config())

