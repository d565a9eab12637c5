"""fireclay's logging: one standard-library logger per stage, and ``FIRECLAY_LOG``.

Loggers (``logging.getLogger(name)``): ``fireclay.capture``, ``fireclay.autograd``,
``fireclay.loops``, ``fireclay.cpp``, ``fireclay.triton`` (all children of ``fireclay``).
A stage package used on its own logs under its distribution's module name
(``fireclay_capture``, ...); once :func:`install` has run (importing ``fireclay.logs`` does it),
those records are forwarded to the matching ``fireclay.<stage>`` logger, so configuring
``fireclay.capture`` configures both and a root handler sees each record once.

The environment variable ``FIRECLAY_LOG`` (``fireclay.config.log``, read when fireclay is imported;
assigning the setting applies a new spec) turns output on::

    FIRECLAY_LOG="capture,loops=debug"   # capture at INFO, loops at DEBUG
    FIRECLAY_LOG="+autograd"             # "+stage" is short for stage=debug
    FIRECLAY_LOG="all=info"              # every stage
    FIRECLAY_LOG="cache"                 # the compile cache: each stage's hit or miss
    FIRECLAY_LOG="recompiles,graph_breaks,guards,output_code,perf_hints,stage_times"   # channels

Items are comma separated: ``STAGE``, ``+STAGE`` or ``STAGE=LEVEL`` where LEVEL is a standard
level name (debug, info, warning, error). Named stages print to stderr through one handler on
the ``fireclay`` logger (``[fireclay.loops] DEBUG: ...``) unless that logger already has a
handler. Unknown stages or levels are reported with a warning and skipped, never an exception:
a typo in an environment variable must not break ``import fireclay``.
"""

from __future__ import annotations

import contextlib
import logging
import sys
import time
import warnings
from collections.abc import Iterator

# stage -> the logger name the stage package uses itself.
STAGES: dict[str, str] = {
    "capture": "fireclay_capture",
    "autograd": "fireclay_autograd",
    "loops": "fireclay_loops",
    "cpp": "fireclay_cpp",
    "triton": "fireclay_triton",
}
# Loggers of this package itself, nameable in FIRECLAY_LOG like a stage: "cache" is the compile
# cache (which stages' artifacts were reused from an earlier process).
OWN: dict[str, str] = {"cache": "fireclay.cache"}
# Channels: one kind of message across stages, as TORCH_LOGS' artifacts. Those in QUIET are off
# unless named (or "all"): a stage's own level does not turn them on; the others follow their
# parent logger too (FIRECLAY_LOG=capture shows recompiles, INFO on "fireclay" shows perf hints).
CHANNELS: dict[str, str] = {
    "recompiles": "fireclay_capture.recompiles",    # a new capture of a function, with the failing guard
    "graph_breaks": "fireclay_capture.graph_breaks",  # where (file:line) and why a graph was split
    "guards": "fireclay_capture.guards",            # the guard set of each new cache entry
    "output_code": "fireclay.output_code",          # where each graph's generated code was written
    "perf_hints": "fireclay.perf_hints",            # options that change nothing here, and why
    "stage_times": "fireclay.stage_times",          # each stage's own time, per graph
}
QUIET = ("graph_breaks", "guards", "output_code", "stage_times")
ROOT = "fireclay"

_LEVELS = {"debug": logging.DEBUG, "info": logging.INFO, "warning": logging.WARNING,
           "warn": logging.WARNING, "error": logging.ERROR, "critical": logging.CRITICAL}


def stage_logger(stage: str) -> logging.Logger:
    """The ``fireclay.<stage>`` logger."""
    if stage not in STAGES:
        raise KeyError(f"no fireclay stage {stage!r}; stages are: {', '.join(STAGES)}")
    return logging.getLogger(f"{ROOT}.{stage}")


class _ForwardToStage(logging.Handler):
    """Re-dispatches a stage package's records through its ``fireclay.<stage>`` logger."""

    def __init__(self, stage: str):
        super().__init__()
        self.stage = stage

    def emit(self, record: logging.LogRecord) -> None:
        target = stage_logger(self.stage)
        forwarded = logging.makeLogRecord(record.__dict__)
        # A channel below the package (fireclay_capture.recompiles) keeps its name under the stage.
        package = STAGES[self.stage]
        suffix = record.name[len(package):] if record.name.startswith(package + ".") else ""
        forwarded.name = target.name + suffix
        target.handle(forwarded)


def install() -> None:
    """Forward every stage package's logger to its ``fireclay.<stage>`` logger (idempotent)."""
    for name in QUIET:
        channel = logging.getLogger(CHANNELS[name])
        if channel.level == logging.NOTSET:  # not inherited from its stage: named, or off
            channel.setLevel(logging.WARNING)
    for stage, package_name in STAGES.items():
        package = logging.getLogger(package_name)
        if any(isinstance(h, _ForwardToStage) for h in package.handlers):
            continue
        package.addHandler(_ForwardToStage(stage))
        # The forwarded copy reaches the root through fireclay.<stage>; the original must not.
        package.propagate = False


def parse_spec(spec: str) -> tuple[dict[str, int], list[str]]:
    """``"capture,loops=debug"`` -> ({"capture": INFO, "loops": DEBUG}, problems)."""
    levels: dict[str, int] = {}
    problems: list[str] = []
    for raw in spec.split(","):
        item = raw.strip()
        if not item:
            continue
        if "=" in item:
            name, _, level_name = item.partition("=")
            name, level_name = name.strip().lower(), level_name.strip().lower()
        elif item.startswith("+"):
            name, level_name = item[1:].strip().lower(), "debug"
        else:
            name, level_name = item.lower(), "info"
        if level_name not in _LEVELS:
            problems.append(f"{item!r}: unknown level {level_name!r} (use one of {', '.join(sorted(set(_LEVELS) - {'warn'}))})")
            continue
        known = [*STAGES, *OWN, *CHANNELS]
        names = known if name == "all" else [name]
        if name != "all" and name not in known:
            problems.append(f"{item!r}: unknown stage or channel {name!r} (stages: {', '.join([*STAGES, *OWN])}; "
                            f"channels: {', '.join(CHANNELS)}; or all)")
            continue
        for stage in names:
            levels[stage] = _LEVELS[level_name]
    return levels, problems


def set_levels(levels: dict[str, int], stream=None) -> None:
    """Set each named stage's level (both logger names) and make sure the output is printed."""
    install()
    for stage, level in levels.items():
        if stage in OWN or stage in CHANNELS:
            logging.getLogger({**OWN, **CHANNELS}[stage]).setLevel(level)
            continue
        stage_logger(stage).setLevel(level)
        # The package logger decides whether a record is made at all.
        logging.getLogger(STAGES[stage]).setLevel(level)
    root = logging.getLogger(ROOT)
    if levels and not root.handlers:
        handler = logging.StreamHandler(stream if stream is not None else sys.stderr)
        handler.setFormatter(logging.Formatter("[%(name)s] %(levelname)s: %(message)s"))
        root.addHandler(handler)


def configure(spec: str, source: str = "the logging spec") -> dict[str, int]:
    """Apply a logging spec (``fireclay.config.log``, from ``FIRECLAY_LOG``); returns the levels it
    set. Problems become one warning naming ``source``."""
    install()
    if not spec.strip():
        return {}
    levels, problems = parse_spec(spec)
    if problems:
        warnings.warn(f"{source}={spec!r}: ignored " + "; ".join(problems), stacklevel=2)
    set_levels(levels)
    return levels


# What config.verbose turns on, and the levels it replaced (to put back when it is turned off).
VERBOSE = ("capture", "recompiles", "graph_breaks", "perf_hints")
_before_verbose: dict[str, int] | None = None


def _logger_for(name: str) -> logging.Logger:
    return stage_logger(name) if name in STAGES else logging.getLogger({**OWN, **CHANNELS}[name])


def set_verbose(on: bool) -> None:
    """``config.verbose``: captures, recompiles, graph breaks and perf hints at INFO (or back)."""
    global _before_verbose
    if on and _before_verbose is None:
        install()
        _before_verbose = {name: _logger_for(name).level for name in VERBOSE}
        set_levels({name: min(logging.INFO, _logger_for(name).getEffectiveLevel()) for name in VERBOSE})
    elif not on and _before_verbose is not None:
        for name, level in _before_verbose.items():
            _logger_for(name).setLevel(level)
            if name in STAGES:
                logging.getLogger(STAGES[name]).setLevel(level)
        _before_verbose = None


@contextlib.contextmanager
def timed(stage: str, what: str) -> Iterator[dict[str, float]]:
    """Time a block and log it at DEBUG on the stage's logger; the dict gets ``seconds``."""
    result: dict[str, float] = {}
    start = time.perf_counter()
    try:
        yield result
    finally:
        result["seconds"] = time.perf_counter() - start
        stage_logger(stage).debug("%s took %.1f ms", what, result["seconds"] * 1e3)


install()
