"""The umbrella's compile cache is the user's own: by default in the user's cache folder (never a
shared temporary folder), and an artifact planted in a folder another user can write (with a
correct checksum header) is never used: the compiled program still matches eager."""

from __future__ import annotations

import hashlib
import os
import shutil
from pathlib import Path

import pytest
import torch

import fireclay
from fireclay import compile_cache
from fireclay_loops import cache_dirs
from fireclay_loops.cache_dirs import CacheFolderWarning

OTHER_UID = 12345


@pytest.fixture(autouse=True)
def _fresh():
    cache_dirs.forget_verdicts()
    fireclay.reset_cache_stats()
    yield
    cache_dirs.forget_verdicts()
    fireclay.reset_cache_stats()


def scaled(x):
    return torch.tanh(x) * 2.0 + 1.0


def shifted(x):  # same inputs, other results: its schedule planted under scaled's key
    return torch.sigmoid(x) - 3.0


def _compile_into(fn, root: Path, x: torch.Tensor) -> dict[str, Path]:
    """Compile and run ``fn`` with its cache in ``root``; its entries by stage."""
    with fireclay.config.shared.patch(cache_dir=str(root)), fireclay.config.patch(compile_cache=True):
        with torch.no_grad():
            fireclay.compile(fn)(x)
    return {stage: next((root / "artifacts" / stage).rglob("*.json")) for stage in compile_cache.STAGES}


def _forge(entry: Path, payload_from: Path, target: Path) -> None:
    """Write ``payload_from``'s payload at ``target`` under ``entry``'s key, with a valid header."""
    stage, key = entry.read_text().split("\n", 1)[0].split(" ")[3:]
    payload = payload_from.read_text().split("\n", 1)[1]
    digest = hashlib.sha256(payload.encode()).hexdigest()
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text(f"{compile_cache.ENTRY_MAGIC} {digest} {stage} {key}\n{payload}")


def _give_away(path, monkeypatch) -> None:
    if os.geteuid() == 0:
        os.chown(path, OTHER_UID, OTHER_UID)
    else:  # every folder of this user now counts as another user's
        monkeypatch.setattr(cache_dirs, "_uid", lambda: os.geteuid() + 1)


@pytest.mark.parametrize("weaken", ["root_0777", "root_of_another_user"])
def test_an_artifact_planted_in_a_cache_others_can_write_is_not_used(tmp_path, monkeypatch, weaken):
    x = torch.randn(3, 5)
    mine = _compile_into(scaled, tmp_path / "ref-scaled", x)
    theirs = _compile_into(shifted, tmp_path / "ref-shifted", x)
    root = tmp_path / "victim"
    for stage, entry in mine.items():  # scaled's keys, shifted's programs
        _forge(entry, theirs[stage], root / entry.relative_to(tmp_path / "ref-scaled"))
    shutil.rmtree(tmp_path / "ref-scaled" / "artifacts")  # only the planted copies remain
    if weaken == "root_0777":
        os.chmod(root, 0o777)
    else:
        _give_away(root, monkeypatch)
    fireclay.reset_cache_stats()
    with fireclay.config.shared.patch(cache_dir=str(root)), fireclay.config.patch(compile_cache=True), pytest.warns(CacheFolderWarning):
        compiled = fireclay.compile(scaled)
        fresh = torch.randn(3, 5)
        with torch.no_grad():
            torch.testing.assert_close(compiled(fresh), scaled(fresh))
    stats = fireclay.cache_stats()
    assert stats["loops"]["hits"] == 0 and stats["autograd"]["hits"] == 0


def test_the_default_cache_is_in_the_users_cache_folder(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    defaults = fireclay.config.shared.__class__()
    assert defaults.cache_dir == ""  # resolved at use: never a folder in the shared temp dir
    x = torch.randn(3, 5)
    with fireclay.config.shared.patch(cache_dir=defaults.cache_dir), fireclay.config.patch(compile_cache=True):
        with torch.no_grad():
            torch.testing.assert_close(fireclay.compile(scaled)(x), scaled(x))
    root = tmp_path / "xdg" / "fireclay"
    assert any((root / "artifacts").rglob("*.json")) and any((root / "cpp").rglob("*.so"))
    for folder in (root, root / "artifacts", root / "cpp"):
        assert (folder.stat().st_mode & 0o777) == 0o700
