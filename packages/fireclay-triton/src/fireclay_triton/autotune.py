"""Launch configurations: a heuristic first choice, a small set to autotune over, and the
results cached on disk (keyed by the kernel's source hash, the size bucket, the GPU's name and
Triton's version), so a warm process or a second run pays nothing."""

from __future__ import annotations

import json
import os
import threading
from dataclasses import asdict, dataclass

import triton

from fireclay_ir.files import write_atomic
from fireclay_loops.cache_dirs import cache_folder_or_private

_LOCK = threading.Lock()


@dataclass(frozen=True)
class LaunchConfig:
    XBLOCK: int
    RBLOCK: int = 0  # 0: a pointwise kernel
    num_warps: int = 4
    num_stages: int = 1


def next_pow2(n: int) -> int:
    return 1 << max(0, (max(1, n) - 1).bit_length())


def candidates(kind: str, numel: int, rnumel: int, interpret: bool, columns: bool = False,
               wide: bool = False) -> list[LaunchConfig]:
    """Configs to try, the heuristic choice first. ``columns``: a reduction contiguous along the
    outer points (tiles wide in ``XBLOCK``); ``wide``: max-autotune's larger set.

    Every config tried costs a Triton compile (about half a second of CPU) on the first call, so
    the default sets are small: one config for 1-D pointwise kernels (at 1024 points and four warps
    a program streams memory at the card's bandwidth whatever the size; smaller sizes are capped to
    their own), two or three for the others, whose best tile depends on the shape."""
    xcap = next_pow2(numel)
    rcap = next_pow2(rnumel)
    if kind == "pointwise":
        if interpret:  # fewer, larger programs: the interpreter's cost is per program
            return [LaunchConfig(min(xcap, 8192))]
        shapes = [(1024, 4)]
        if wide:
            shapes += [(512, 4), (2048, 8), (256, 2), (128, 4), (4096, 8), (1024, 8), (512, 2), (256, 4), (64, 2)]
        found = [LaunchConfig(min(xcap, x), 0, w) for x, w in shapes]
    elif kind == "tiled":  # rows x columns of a 2D pointwise tile; grid axis 1 is at most 65535 tiles
        if interpret:
            return [LaunchConfig(min(xcap, 64), min(rcap, 64))]
        shapes = [(64, 64, 4), (32, 32, 4)]
        if wide:
            shapes += [(32, 64, 4), (64, 32, 4), (128, 32, 8), (16, 64, 4), (64, 64, 8), (128, 64, 8), (64, 128, 8), (16, 128, 4), (128, 16, 4), (32, 128, 4)]
        rmin = -(-rnumel // 65535)
        found = [LaunchConfig(min(xcap, x), max(min(rcap, r), next_pow2(rmin)), w) for x, r, w in shapes]
    elif kind == "split":  # the tile of one chunk; the launcher picks the chunks
        if interpret:
            return [LaunchConfig(min(xcap, 32), min(rcap, 64))]
        shapes = [(32, 128, 8, 3), (64, 64, 8, 3), (16, 256, 8, 3)]
        if wide:
            shapes += [(32, 64, 4, 3), (64, 32, 4, 2), (128, 16, 4, 2), (128, 32, 8, 3), (16, 128, 4, 4), (32, 256, 8, 2), (64, 128, 8, 2)]
        found = [LaunchConfig(min(xcap, x), min(rcap, r), w, s) for x, r, w, s in shapes]
    elif kind == "persistent":
        rblock = rcap
        if interpret:
            return [LaunchConfig(min(xcap, max(1, 8192 // rblock)), rblock)]
        found = []
        sizes = (2048, 4096) + ((1024, 8192, 512, 16384) if wide else ())
        for elems in sizes:
            x = min(xcap, max(1, elems // rblock))
            found.append(LaunchConfig(x, rblock, max(1, min(16, x * rblock // 256))))
            if wide or rblock >= 4096:  # long rows: fewer values per thread, no spills
                found.append(LaunchConfig(x, rblock, max(1, min(32, x * rblock // 128))))
    else:
        if interpret:
            return [LaunchConfig(min(xcap, 16), min(rcap, 1024))]
        if columns:
            # wide rows of contiguous addresses, narrow enough in XBLOCK to give every SM programs
            shapes = [(32, 128, 8, 3), (16, 256, 8, 3), (64, 64, 8, 3)]
            more = [(16, 128, 4, 3), (32, 64, 4, 2), (128, 32, 8, 2), (8, 512, 8, 2)]
            if numel < 2048:
                shapes = [(16, 256, 8, 3)] + shapes
        elif numel < 1024:
            shapes = [(1, 2048, 8, 1), (8, 512, 8, 2), (1, 1024, 4, 2)]
            more = [(32, 128, 4, 2), (64, 64, 4, 1)]
        else:
            shapes = [(8, 512, 8, 2), (64, 64, 4, 1), (32, 128, 4, 2)]
            more = [(1, 2048, 8, 1)]
        if wide:
            shapes += more + [(1, 4096, 16, 2), (2, 2048, 8, 3), (4, 1024, 8, 3), (1, 1024, 8, 4), (16, 64, 4, 4),
                       (256, 16, 8, 3), (64, 32, 4, 4)]
        found = [LaunchConfig(min(xcap, x), min(rcap, r), w, s) for x, r, w, s in shapes]
    return list(dict.fromkeys(found))


class TuningCache:
    """Chosen configs in one JSON file; written whole, atomically, after each new result. The file
    is read and written only in a folder that is this user's alone (else in a private stand-in:
    :mod:`fireclay_loops.cache_dirs`)."""

    def __init__(self, folder: str):
        self.path = os.path.join(cache_folder_or_private(folder), "autotune.json")
        self._data: dict | None = None

    def _load(self) -> dict:
        if self._data is None:
            try:
                with open(self.path) as f:
                    self._data = json.load(f)
            except (OSError, ValueError):
                self._data = {}
        return self._data

    def get(self, key: str) -> LaunchConfig | None:
        found = self._load().get(key)
        return LaunchConfig(**found) if found else None

    def put(self, key: str, cfg: LaunchConfig) -> None:
        with _LOCK:
            # merge into what is on disk now: other programs' caches (other instances, other
            # processes) may have written since this one was read
            self._data = None
            data = self._load()
            data[key] = asdict(cfg)
            write_atomic(self.path, json.dumps(data, indent=1, sort_keys=True))


def tuning_key(source_hash: str, numel: int, rnumel: int, device_name: str) -> str:
    return f"{source_hash}/{next_pow2(numel)}x{next_pow2(rnumel)}/{device_name}/triton-{triton.__version__}"
