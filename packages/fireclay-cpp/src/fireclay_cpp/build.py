"""Compile C++ into shared libraries, once: an on-disk cache keyed by what decides the binary.

Key: sha256 of the source, the compiler's path and ``--version``, the flags, the CPU (flags say
``-march=native``) and fireclay-cpp's version. Layout: ``<cache>/<key[:2]>/<key>.{cpp,so,json}``;
the ``.json`` records the library's size and sha256, written last, so an entry is complete only
when its record matches. The record guards against a torn or damaged entry, not against another
user: that is the folder's part. Every folder of an entry is checked by
:func:`fireclay_loops.cache_dirs.private_folder` (this user's alone, mode 0700) before anything
in it is read or loaded; a folder that fails is replaced, with one warning, by a private
temporary one for this process, so the library is compiled there and nothing planted is loaded.

Safe under concurrency: a build holds an exclusive lock on ``<key>.lock`` (``fcntl``), writes to
``mkstemp`` names in the entry's folder and publishes with ``os.replace``; whoever takes the lock second finds the
entry built. A corrupt entry (truncated, overwritten, unloadable) fails the check and is rebuilt.
Libraries that all need building compile in parallel, one compiler process each.
"""

from __future__ import annotations

import ctypes
import functools
import hashlib
import json
import os
import platform
import shutil
import subprocess
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass

from fireclay_cpp.config import Config, config
from fireclay_cpp.errors import BuildError
from fireclay_ir.files import write_atomic
from fireclay_loops.cache_dirs import cache_folder_or_private

try:
    import fcntl
except ImportError:  # pragma: no cover - not POSIX
    fcntl = None

_VERSION = "0.1.0"  # fireclay-cpp's; kept here so the key does not depend on import order


@functools.cache
def compiler_identity(compiler: str) -> str:
    """The compiler's resolved path and the first line of its ``--version``."""
    path = shutil.which(compiler)
    if path is None:
        raise BuildError(f"C++ compiler {compiler!r} not found: install g++ (or clang++) or set FIRECLAY_CPP_COMPILER "
                         "to the compiler's path")
    out = subprocess.run([path, "--version"], capture_output=True, text=True, timeout=60)
    return f"{os.path.realpath(path)} {out.stdout.splitlines()[0] if out.stdout else ''}"


@functools.cache
def _cpu() -> str:
    """The CPU's model and feature flags: ``-march=native`` binaries are only right on it."""
    seen: dict[str, str] = {}
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                key = line.split(":", 1)[0].strip()
                if key in ("model name", "flags") and key not in seen:
                    seen[key] = line
                if len(seen) == 2:
                    break
    except OSError:
        pass
    text = "".join(seen.values()) or platform.processor()
    return platform.machine() + " " + hashlib.sha256(text.encode()).hexdigest()[:16]


def cache_key(source: str, cfg: Config = config) -> str:
    ident = [source, compiler_identity(cfg.resolved_compiler()), cfg.flags(), cfg.link_flags(), _cpu(), _VERSION]
    return hashlib.sha256(json.dumps(ident).encode()).hexdigest()


@dataclass
class Library:
    """A loaded library and how it was obtained."""

    handle: ctypes.CDLL
    path: str
    key: str
    cached: bool  # True: taken from the cache, no compiler run
    seconds: float  # compile time (0 when cached)


def _paths(key: str, cfg: Config) -> tuple[str, str, str, str]:
    """The entry's folder (checked, made 0700, or a private stand-in) and its source, library and
    record."""
    folder = cache_folder_or_private(os.path.join(cache_folder_or_private(cfg.resolved_cache_dir()), key[:2]))
    base = os.path.join(folder, key)
    return folder, base + ".cpp", base + ".so", base + ".json"


def _sha256(path: str) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def _entry_ok(so: str, record: str) -> bool:
    try:
        with open(record) as f:
            meta = json.load(f)
        return os.path.getsize(so) == meta["size"] and _sha256(so) == meta["sha256"]
    except (OSError, ValueError, KeyError, TypeError):
        return False


@contextmanager
def _locked(path: str):
    if fcntl is None:
        yield
        return
    with open(path, "a") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def _compile(source: str, key: str, cfg: Config, force: bool = False) -> float:
    """Build the entry for ``key`` unless a valid one exists; returns compile seconds (0: none)."""
    folder, cpp, so, record = _paths(key, cfg)
    with _locked(os.path.join(folder, key + ".lock")):
        if _entry_ok(so, record) and not force:
            return 0.0
        write_atomic(cpp, source + f'\nextern "C" const char* fc_cache_key() {{ return "{key}"; }}\n')
        fd, tmp = tempfile.mkstemp(prefix=f".{key}-", suffix=".so", dir=folder)
        os.close(fd)  # the compiler writes it; the name is ours, made exclusively
        cmd = [cfg.resolved_compiler(), *cfg.flags(), cpp, *cfg.link_flags(), "-o", tmp]
        start = time.perf_counter()
        proc = subprocess.run(cmd, capture_output=True, text=True)
        seconds = time.perf_counter() - start
        if proc.returncode != 0:
            if os.path.exists(tmp):
                os.unlink(tmp)
            raise BuildError(f"the C++ compiler failed on {cpp}\ncommand: {' '.join(cmd)}\n"
                             f"{proc.stderr[-4000:]}\nThis is a fireclay-cpp bug: please report it with that file.")
        meta = {"size": os.path.getsize(tmp), "sha256": _sha256(tmp), "compiler": compiler_identity(
            cfg.resolved_compiler()), "flags": cfg.flags(), "seconds": round(seconds, 3)}
        os.replace(tmp, so)
        write_atomic(record, json.dumps(meta, indent=1))
        return max(seconds, 1e-9)


def _load(key: str, cfg: Config) -> ctypes.CDLL | None:
    _, _, so, record = _paths(key, cfg)
    if not _entry_ok(so, record):
        return None
    try:
        lib = ctypes.CDLL(so)
        lib.fc_cache_key.restype = ctypes.c_char_p
        if lib.fc_cache_key() != key.encode():
            return None
    except (OSError, AttributeError):
        return None
    return lib


def build_libraries(sources: list[str], cfg: Config = config) -> list[Library]:
    """Compile (or find in the cache) one library per source and load them. Sources that need
    building compile in parallel."""
    keys = [cache_key(s, cfg) for s in sources]
    unique = dict(zip(keys, sources))
    libs: dict[str, ctypes.CDLL | None] = {k: _load(k, cfg) for k in unique}
    # An entry whose record matches but which does not load is rebuilt regardless.
    missing = [(k, s, _entry_ok(*_paths(k, cfg)[2:])) for k, s in unique.items() if libs[k] is None]
    seconds: dict[str, float] = {}
    if missing:
        workers = max(1, min(len(missing), os.cpu_count() or 1))
        with ThreadPoolExecutor(workers) as pool:
            done = pool.map(lambda m: _compile(m[1], m[0], cfg, force=m[2]), missing)
            for (k, _, _), secs in zip(missing, done):
                seconds[k] = secs
        for k, _, _ in missing:
            libs[k] = _load(k, cfg)
            if libs[k] is None:
                raise BuildError(f"the library built for cache key {k} does not load: is the cache folder "
                                 f"{cfg.resolved_cache_dir()} writable and on a local disk?")
    return [Library(libs[k], _paths(k, cfg)[2], k, seconds.get(k, 0.0) == 0.0, seconds.get(k, 0.0)) for k in keys]


def build_library(source: str, cfg: Config = config) -> Library:
    return build_libraries([source], cfg)[0]
