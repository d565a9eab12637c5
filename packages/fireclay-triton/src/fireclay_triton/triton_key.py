"""Triton's version key: computed in parallel, and kept beside Triton's cache so that each
process need not compute it again.

Every Triton compile, a cache hit too, starts from ``triton.runtime.cache.triton_key()``: a
SHA-256 over Triton's compiler and language sources and its 400 MB ``libtriton`` library, hashed
in one stream once per process: most of a warm start's compile time, and the largest part of a
cold start's compiler warm-up (docs/status.md).

:func:`install` replaces that key, in this process (and the compile server it forks), by one
computed here from every file of Triton's package, large files hashed in parallel chunks
(:func:`installation_key`): it changes whenever any file Triton's own key reads changes, so it
separates Triton versions and builds as well; it differs from Triton's own key, so fireclay's
processes share cache entries among themselves, not with other users of Triton's cache. The key
is stored in Triton's cache folder together with a stamp of the installation (path, size and
modification time of every file), and a later process whose installation has the same stamp
reads it instead of hashing. An empty cache folder (a cold start) hashes again, and so does a
folder another user could write (:func:`fireclay_loops.cache_dirs.private_folder`): the key is
then neither read from it nor stored in it.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import threading
from concurrent.futures import ThreadPoolExecutor

from fireclay_ir.files import write_atomic
from fireclay_loops.cache_dirs import private_folder

_lock = threading.Lock()
_done: list[str] = []  # the key, once install has run

FILE_NAME = "fireclay-triton-key.json"
CHUNK = 16 << 20  # bytes of a large file hashed as one piece


def _files(root: str) -> list[str]:
    """Every file under ``root`` but bytecode caches, in a fixed order."""
    found = []
    for folder, dirs, files in os.walk(root):
        dirs[:] = sorted(d for d in dirs if d != "__pycache__")
        found += [os.path.join(folder, name) for name in sorted(files)]
    return found


def _piece_digest(piece: tuple[str, int]) -> str:
    path, offset = piece
    with open(path, "rb") as f:
        return hashlib.sha256(os.pread(f.fileno(), CHUNK, offset)).hexdigest()


def installation_key(root: str, version: str, workers: int | None = None) -> str:
    """A key of the installation under ``root``: a SHA-256 over each file's relative path and
    the digests of its ``CHUNK``-byte pieces, the pieces hashed on ``workers`` threads (hashing
    and reading release the GIL)."""
    pieces: list[tuple[str, int]] = []
    owners: list[str] = []
    for path in _files(root):
        try:
            size = os.path.getsize(path)
        except OSError:
            continue
        for offset in range(0, max(size, 1), CHUNK):
            pieces.append((path, offset))
            owners.append(os.path.relpath(path, root))
    workers = workers or min(16, os.cpu_count() or 1)
    with ThreadPoolExecutor(max(1, workers), thread_name_prefix="fireclay-triton-key") as pool:
        digests = list(pool.map(_piece_digest, pieces))
    whole = hashlib.sha256(version.encode())
    for owner, digest in zip(owners, digests):
        whole.update(f"{owner}:{digest}\n".encode())
    return f"{version}-fireclay-{whole.hexdigest()}"


def installation_stamp(root: str) -> str:
    """A digest of every file under ``root`` (Triton's package folder): relative path, size and
    modification time; bytecode caches are left out."""
    entries = []
    for path in _files(root):
        try:
            st = os.stat(path)
        except OSError:
            continue
        entries.append(f"{os.path.relpath(path, root)}:{st.st_size}:{st.st_mtime_ns}")
    return hashlib.sha256("\n".join(entries).encode()).hexdigest()


def _cache_folder() -> str | None:
    try:
        from triton import knobs

        return knobs.cache.dir
    except (ImportError, AttributeError):
        return None


def install() -> str | None:
    """Make :func:`installation_key` this process's ``triton_key()``: read back when Triton's
    installation is unchanged, else computed and stored. Once per process; returns the key
    (None: this Triton has no such key, and nothing is changed)."""
    if _done:
        return _done[0]
    with _lock:
        if _done:
            return _done[0]
        try:
            import triton
            import triton.runtime.cache as cache
        except ImportError:
            return None
        folder = _cache_folder()
        if getattr(cache, "triton_key", None) is None or folder is None:
            return None
        root = os.path.dirname(os.path.abspath(triton.__file__))
        stamp = installation_stamp(root)
        path = os.path.join(folder, FILE_NAME) if private_folder(folder) else None
        key = _stored(path, stamp) if path else None
        if key is None:
            key = installation_key(root, getattr(triton, "__version__", "unknown"))
            if path:
                _store(path, stamp, key)
        cache.triton_key = functools.lru_cache(maxsize=None)(lambda: key)
        _done.append(key)
        return key


def _stored(path: str, stamp: str) -> str | None:
    try:
        with open(path) as f:
            found = json.load(f)
    except (OSError, ValueError):
        return None
    if not isinstance(found, dict) or found.get("stamp") != stamp or not isinstance(found.get("key"), str):
        return None
    return found["key"]


def _store(path: str, stamp: str, key: str) -> None:
    try:
        write_atomic(path, json.dumps({"stamp": stamp, "key": key}))
    except OSError:  # a read-only cache: each process computes the key, as Triton does
        pass
