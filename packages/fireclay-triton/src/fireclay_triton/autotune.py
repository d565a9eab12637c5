"""Launch configurations: a heuristic first choice, a small set to autotune over, and the
results cached on disk (keyed by the kernel's source hash, the size bucket, the GPU's name and
Triton's version), so a warm process or a second run pays nothing."""

from __future__ import annotations

import json
import os
import threading
from dataclasses import asdict, dataclass

import triton

_LOCK = threading.Lock()


@dataclass(frozen=True)
class LaunchConfig:
    XBLOCK: int
    RBLOCK: int = 0  # 0: a pointwise kernel
    num_warps: int = 4
    num_stages: int = 1


def next_pow2(n: int) -> int:
    return 1 << max(0, (max(1, n) - 1).bit_length())


def candidates(kind: str, numel: int, rnumel: int, interpret: bool) -> list[LaunchConfig]:
    """Configs to try, the heuristic choice first."""
    xcap = next_pow2(numel)
    if kind == "pointwise":
        if interpret:  # fewer, larger programs: the interpreter's cost is per program
            return [LaunchConfig(min(xcap, 8192))]
        found = [LaunchConfig(min(xcap, x), 0, w) for x, w in ((1024, 4), (512, 4), (2048, 8), (256, 2), (128, 4))]
    elif kind == "persistent":
        rblock = next_pow2(rnumel)
        if interpret:
            return [LaunchConfig(min(xcap, max(1, 8192 // rblock)), rblock)]
        found = []
        for elems in (2048, 4096, 1024, 8192):
            x = min(xcap, max(1, elems // rblock))
            found.append(LaunchConfig(x, rblock, max(1, min(16, x * rblock // 256))))
    else:
        rcap = next_pow2(rnumel)
        if interpret:
            return [LaunchConfig(min(xcap, 16), min(rcap, 1024))]
        shapes = ((1, 2048, 8, 1), (8, 512, 8, 2), (1, 1024, 4, 2), (32, 128, 4, 2), (64, 64, 4, 1)) \
            if numel < 1024 else ((8, 512, 8, 2), (64, 64, 4, 1), (32, 128, 4, 2), (1, 2048, 8, 1))
        found = [LaunchConfig(min(xcap, x), min(rcap, r), w, s) for x, r, w, s in shapes]
    return list(dict.fromkeys(found))


class TuningCache:
    """Chosen configs in one JSON file; written whole, atomically, after each new result."""

    def __init__(self, folder: str):
        self.path = os.path.join(folder, "autotune.json")
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
            data = self._load()
            data[key] = asdict(cfg)
            os.makedirs(os.path.dirname(self.path), exist_ok=True)
            tmp = f"{self.path}.{os.getpid()}.tmp"
            with open(tmp, "w") as f:
                json.dump(data, f, indent=1, sort_keys=True)
            os.replace(tmp, self.path)


def tuning_key(source_hash: str, numel: int, rnumel: int, device_name: str) -> str:
    return f"{source_hash}/{next_pow2(numel)}x{next_pow2(rnumel)}/{device_name}/triton-{triton.__version__}"
