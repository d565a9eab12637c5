"""The compile cache across processes: every stage's artifact except capture's.

A second process that compiles the same model for the same inputs finds on disk what the
stages made the first time:

* ``autograd``: the forward/backward (or inference) aten programs and the runtime plan, as
  fireclay-autograd's artifact text (:func:`fireclay_autograd.dumps_artifact`);
* ``loops``: the scheduled loop program of each aten program, in the ``loops`` dialect;
* code generation keeps its own caches (fireclay-cpp's shared libraries by source hash under
  ``<cache root>/cpp``, fireclay-triton's kernels and Triton's), all under the same root.

Entries are read and written only in folders that are this user's alone
(:func:`fireclay_loops.cache_dirs.private_folder`): under a folder that is not, with one warning,
every lookup misses and nothing is stored.

Keys are SHA-256 digests of the stage's input program in fireclay-ir's canonical JSON (weights
by metadata, never their values), the metadata of the inputs (dtype, shape, strides, device,
requires_grad), grad mode, the stage's configuration, the versions of fireclay, its stages and
torch, and a digest of those stages' source files. Entries live under
``<cache root>/artifacts/<stage>/`` (the root: ``fireclay.config.shared.cache_dir``, by default the user's cache
folder); each file starts with a header holding the digest of its
payload, is written to a temporary file and renamed into place (readers never see half a file),
and an entry that fails its checksum or does not load is counted as corrupt, rebuilt and
overwritten. ``config.compile_cache = False`` (or ``FIRECLAY_COMPILE_CACHE=0``) turns it off.

Every hit and miss is logged on the ``fireclay.cache`` logger (INFO) and counted:
:func:`cache_stats` returns the counts per stage.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import os
import time
from typing import Any

import torch

from fireclay import stages
from fireclay.config import config
from fireclay_ir.files import write_atomic
from fireclay_loops.cache_dirs import default_root, private_folder

log = logging.getLogger("fireclay.cache")

ENTRY_MAGIC = "fireclay-cache-entry 1"
STAGES = ("autograd", "loops")


@dataclasses.dataclass
class StageCounts:
    hits: int = 0
    misses: int = 0
    stored: int = 0
    corrupt: int = 0  # entries that failed their checksum or did not load, then rebuilt
    uncacheable: int = 0  # artifacts with no serialized form: built every time
    load_seconds: float = 0.0  # spent reading entries that hit
    build_seconds: float = 0.0  # spent building what missed


_counts: dict[str, StageCounts] = {s: StageCounts() for s in STAGES}


def cache_stats() -> dict[str, dict[str, Any]]:
    """Hits, misses, entries stored and corrupt entries rebuilt, per stage, in this process."""
    return {stage: dataclasses.asdict(c) for stage, c in _counts.items()}


def reset_cache_stats() -> None:
    for stage in STAGES:
        _counts[stage] = StageCounts()


class CorruptEntry(Exception):
    """A cache file that is not what was written (truncated, edited, or another format)."""


def _root() -> str:
    return os.path.join(default_root(), "artifacts")


def _trusted(folder: str) -> bool:
    """Whether the cache's root folder and ``folder`` under it are this user's alone (made if
    missing); one warning for a root that is not."""
    return private_folder(_root()) is not None and private_folder(folder) is not None


def entry_path(stage: str, key: str) -> str:
    return os.path.join(_root(), stage, key[:2], key + ".json")


def read_entry(stage: str, key: str) -> str | None:
    """The payload stored for ``key``, None if there is none; CorruptEntry if the file is bad."""
    path = entry_path(stage, key)
    if not os.path.isdir(os.path.dirname(path)) or not _trusted(os.path.dirname(path)):
        return None  # nothing stored, or stored where another user could have written it
    try:
        with open(path, encoding="utf-8") as f:
            text = f.read()
    except FileNotFoundError:
        return None
    except (OSError, UnicodeDecodeError) as e:
        raise CorruptEntry(f"{path}: unreadable ({type(e).__name__}: {e})") from None
    header, sep, payload = text.partition("\n")
    parts = header.split(" ")
    if not sep or len(parts) != 5 or " ".join(parts[:2]) != ENTRY_MAGIC or parts[3:] != [stage, key]:
        raise CorruptEntry(f"{path}: not a fireclay cache entry for this key")
    if hashlib.sha256(payload.encode("utf-8")).hexdigest() != parts[2]:
        raise CorruptEntry(f"{path}: the payload does not match its checksum (truncated or edited)")
    return payload


def write_entry(stage: str, key: str, payload: str) -> bool:
    """Store ``payload`` atomically (a ``mkstemp`` file in the same folder, renamed into place),
    if its folder is this user's alone; returns whether it was stored."""
    path = entry_path(stage, key)
    if not _trusted(os.path.dirname(path)):
        return False
    digest = hashlib.sha256(payload.encode("utf-8")).hexdigest()
    write_atomic(path, (f"{ENTRY_MAGIC} {digest} {stage} {key}\n" + payload).encode("utf-8"))
    return True


# -- keys

# The packages whose code decides what the cached stages produce.
_PRODUCERS = ("fireclay", "fireclay_ir", "fireclay_shapes", "fireclay_autograd", "fireclay_loops")
_fingerprint: str | None = None


def versions() -> dict[str, str]:
    """The versions an artifact depends on, and a digest of the producing packages' source: a
    version number does not change while the code is being worked on, and an artifact made by
    other code must never be reused."""
    import importlib

    global _fingerprint
    if _fingerprint is None:
        h = hashlib.sha256()
        for name in _PRODUCERS:
            folder = os.path.dirname(importlib.import_module(name).__file__ or "")
            for base, dirs, files in os.walk(folder):
                dirs.sort()
                for f in sorted(files):
                    if f.endswith(".py"):
                        path = os.path.join(base, f)
                        h.update(os.path.relpath(path, folder).encode())
                        with open(path, "rb") as fh:
                            h.update(fh.read())
        _fingerprint = h.hexdigest()
    out = {name: getattr(importlib.import_module(name), "__version__", "?") for name in _PRODUCERS}
    return out | {"torch": torch.__version__, "source": _fingerprint}


def describe_value(x: Any) -> list:
    """What a compiled artifact depends on about one input (not its values)."""
    if isinstance(x, torch.Tensor):
        return ["tensor", str(x.dtype), [str(s) for s in x.shape], [str(s) for s in x.stride()],
                str(x.storage_offset()), str(x.device), bool(x.requires_grad)]
    if x is None or isinstance(x, (bool, int, float, str)):
        return ["value", type(x).__name__, repr(x)]
    return ["value", type(x).__name__]


def digest(*parts: Any) -> str:
    text = json.dumps(parts, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def program_text(program: Any) -> str | None:
    """The canonical JSON of ``program`` (weights by metadata), or None if it has none."""
    from fireclay_ir import dumps

    try:
        return dumps(program)
    except Exception as e:  # a program the format cannot hold is compiled, just not cached
        log.debug("compile cache: program not serializable (%s: %s)", type(e).__name__, e)
        return None


def _short(key: str) -> str:
    return key[:12]


def _lookup(stage: str, key: str) -> str | None:
    try:
        return read_entry(stage, key)
    except CorruptEntry as e:
        _counts[stage].corrupt += 1
        log.warning("compile cache: %s entry %s is corrupt (%s); rebuilding it", stage, _short(key), e)
        return None


def _store(stage: str, key: str, payload: str) -> None:
    try:
        if not write_entry(stage, key, payload):
            return
    except OSError as e:  # a full or read-only disk costs the next process time, nothing else
        log.warning("compile cache: could not write the %s entry under %s (%s)", stage, _root(), e)
        return
    _counts[stage].stored += 1


# -- the autograd stage

class AutogradArtifactCache:
    """What fireclay-autograd's ``CompiledProgram`` asks (``artifact_cache=``): the stored
    inference/training artifact for the inputs it compiles with, and where to store a new one."""

    def __init__(self, program: Any, example_inputs: list, partitioner: str = "min_cut", record: Any = None):
        self.record = record  # the graph's stages.GraphRecord: its autograd stage is timed here
        self._stage: Any = None
        self.program = program
        self.example = [describe_value(x) for x in example_inputs]
        self.partitioner = partitioner
        self._base: str | None = None
        self._started: dict[str, float] = {}
        # id(aten program) -> (program, digest of the artifact text holding it, its role): the
        # loops stage names an aten program so instead of serializing it again.
        self._origins: dict[int, tuple[Any, str, str]] = {}

    def _note_origins(self, payload: str, artifact: Any) -> None:
        from fireclay_autograd import InferenceArtifact

        key = hashlib.sha256(payload.encode("utf-8")).hexdigest()

        if isinstance(artifact, InferenceArtifact):
            roles = [(artifact.program, "inference")]
        else:
            roles = [(artifact.forward, "forward"), (artifact.backward, "backward")]
        for program, role in roles:
            self._origins[id(program)] = (program, key, role)

    def origin(self, program: Any) -> str | None:
        """A digest naming ``program`` if it came from an artifact this cache stored or loaded
        (the digest of the artifact's text, which holds the program's canonical JSON, and the
        program's role in it), else None."""
        found = self._origins.get(id(program))
        if found is None or found[0] is not program:
            return None
        return digest("aten", found[1], found[2])

    def _key(self, kind: str, inputs: list) -> str | None:
        if self._base is None:
            text = program_text(self.program)
            if text is None:
                return None
            self._base = digest("autograd", text, self.example, self.partitioner, versions())
        return digest(self._base, kind, [describe_value(x) for x in inputs], torch.is_grad_enabled())

    def load(self, kind: str, inputs: list) -> Any:
        # The autograd stage runs from here (a lookup, then the trace on a miss) to store().
        if self.record is not None:
            stages.end(self._stage)
            self._stage = stages.begin("autograd", self.record.label)
        artifact = self._load(kind, inputs)
        if artifact is not None:
            self._end_stage()
        return artifact

    def _end_stage(self) -> None:
        stage, self._stage = self._stage, None
        stages.end(stage)

    def _load(self, kind: str, inputs: list) -> Any:
        if not config.compile_cache:
            return None
        from fireclay_autograd import ArtifactError, loads_artifact

        start = time.perf_counter()
        key = self._key(kind, inputs)
        if key is None:
            _counts["autograd"].uncacheable += 1
            return None
        payload = _lookup("autograd", key)
        if payload is not None:
            try:
                artifact = loads_artifact(payload, self.program)
            except ArtifactError as e:
                _counts["autograd"].corrupt += 1
                log.warning("compile cache: autograd entry %s does not load (%s); rebuilding it", _short(key), e)
            else:
                seconds = time.perf_counter() - start
                _counts["autograd"].hits += 1
                _counts["autograd"].load_seconds += seconds
                log.info("compile cache: autograd %s artifact hit (key %s, loaded in %.1f ms)", kind, _short(key),
                         seconds * 1e3)
                self._note_origins(payload, artifact)
                return artifact
        _counts["autograd"].misses += 1
        self._started[key] = time.perf_counter()
        return None

    def store(self, kind: str, inputs: list, artifact: Any) -> None:
        self._end_stage()
        if not config.compile_cache:
            return
        from fireclay_autograd import ArtifactError, dumps_artifact

        key = self._key(kind, inputs)
        if key is None:
            return
        seconds = time.perf_counter() - self._started.pop(key, time.perf_counter())
        _counts["autograd"].build_seconds += seconds
        try:
            payload = dumps_artifact(artifact)
        except ArtifactError as e:
            _counts["autograd"].uncacheable += 1
            log.info("compile cache: autograd %s artifact miss, built in %.1f ms, not storable (%s)", kind,
                     seconds * 1e3, e)
            return
        self._note_origins(payload, artifact)
        _store("autograd", key, payload)
        log.info("compile cache: autograd %s artifact miss (key %s), built in %.1f ms and stored", kind,
                 _short(key), seconds * 1e3)


# -- the loops stage

def scheduled_program(aten_program: Any, example_inputs: list, origin: str | None = None) -> Any:
    """fireclay-loops' scheduled program for ``aten_program``: read from the cache, or lowered,
    scheduled and stored. ``origin`` names the program (see AutogradArtifactCache.origin);
    without it the program is named by its canonical JSON."""
    import fireclay_loops
    from fireclay_ir import loads

    def build() -> Any:
        return fireclay_loops.schedule(fireclay_loops.lower(aten_program))

    if not config.compile_cache:
        return build()
    start = time.perf_counter()
    text = origin or program_text(aten_program)
    if text is None:
        _counts["loops"].uncacheable += 1
        return build()
    key = digest("loops", text, [describe_value(x) for x in example_inputs],
                 dataclasses.asdict(fireclay_loops.config), versions())
    payload = _lookup("loops", key)
    if payload is not None:
        try:
            scheduled = fireclay_loops.from_program(loads(payload, verify=False), trusted=True)
        except Exception as e:  # any failure to rebuild the schedule means: rebuild it from aten
            _counts["loops"].corrupt += 1
            log.warning("compile cache: loops entry %s does not load (%s: %s); rebuilding it", _short(key),
                        type(e).__name__, e)
        else:
            seconds = time.perf_counter() - start
            _counts["loops"].hits += 1
            _counts["loops"].load_seconds += seconds
            log.info("compile cache: loops hit (key %s, %d kernels, loaded in %.1f ms)", _short(key),
                     len(scheduled.kernels), seconds * 1e3)
            return scheduled
    _counts["loops"].misses += 1
    begin = time.perf_counter()
    scheduled = build()
    seconds = time.perf_counter() - begin
    _counts["loops"].build_seconds += seconds
    payload = program_text(fireclay_loops.to_program(scheduled))
    if payload is None or not _round_trips(payload, scheduled):
        _counts["loops"].uncacheable += 1
        return scheduled
    _store("loops", key, payload)
    log.info("compile cache: loops miss (key %s), scheduled %d kernels in %.1f ms and stored", _short(key),
             len(scheduled.kernels), seconds * 1e3)
    return scheduled


def _round_trips(payload: str, scheduled: Any) -> bool:
    """Whether the stored form reads back as the same schedule (its full text form: kernels,
    bodies, call list). A warm process must compile exactly what the cold one did, so a
    program the loops dialect cannot hold faithfully is not stored."""
    import fireclay_loops
    from fireclay_ir import loads

    try:
        same = str(fireclay_loops.from_program(loads(payload, verify=False), trusted=True)) == str(scheduled)
    except Exception as e:
        log.warning("compile cache: a loops program does not read back (%s: %s); not cached", type(e).__name__, e)
        return False
    if not same:
        log.warning("compile cache: a loops program reads back differently; not cached")
    return same
