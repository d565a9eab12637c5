"""The cache folder check every package's disk cache goes through: a folder another local user
could write (their own, or one with group/other write permission, or below one) is refused with
one warning; folders are made 0700; writes go through ``mkstemp`` names."""

from __future__ import annotations

import os
import stat
import warnings

import pytest

import fireclay_ir
from fireclay_ir.files import write_atomic
from fireclay_loops import cache_dirs
from fireclay_loops.cache_dirs import (
    CacheFolderWarning,
    cache_folder_or_private,
    private_folder,
)

OTHER_UID = 12345


@pytest.fixture(autouse=True)
def _fresh_verdicts():
    cache_dirs.forget_verdicts()
    yield
    cache_dirs.forget_verdicts()


def give_away(path, monkeypatch) -> None:
    """Make ``path`` another user's: chown as root, else pretend this process is someone else."""
    if os.geteuid() == 0:
        os.chown(path, OTHER_UID, OTHER_UID)
    else:  # every folder of this user now counts as another user's
        monkeypatch.setattr(cache_dirs, "_uid", lambda: os.geteuid() + 1)


def _refused(folder) -> str:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert private_folder(str(folder)) is None
        assert private_folder(str(folder)) is None  # asked again: no second warning
    assert len(caught) == 1 and caught[0].category is CacheFolderWarning
    return str(caught[0].message)


def _wide_open(path):
    path.mkdir()
    os.chmod(path, 0o777)


def test_new_folders_are_made_private_whatever_the_umask(tmp_path):
    old = os.umask(0)
    try:
        found = private_folder(str(tmp_path / "a" / "b" / "c"))
    finally:
        os.umask(old)
    assert found == str(tmp_path / "a" / "b" / "c")
    for p in (tmp_path / "a", tmp_path / "a" / "b", tmp_path / "a" / "b" / "c"):
        assert stat.S_IMODE(p.stat().st_mode) == 0o700


@pytest.mark.parametrize("mode", [0o777, 0o770, 0o702])
def test_a_folder_others_can_write_is_refused(tmp_path, mode):
    folder = tmp_path / "cache"
    folder.mkdir()
    os.chmod(folder, mode)
    assert "writable by other users" in _refused(folder)


def test_a_folder_of_another_user_is_refused(tmp_path, monkeypatch):
    folder = tmp_path / "cache"
    folder.mkdir(mode=0o700)
    give_away(folder, monkeypatch)
    assert "belongs to another user" in _refused(folder)


def test_a_private_folder_below_a_writable_one_is_refused(tmp_path):
    _wide_open(tmp_path / "shared")
    assert "folder above it" in _refused(tmp_path / "shared" / "mine")


def test_a_sticky_world_writable_parent_is_fine(tmp_path):
    shared = tmp_path / "tmp"
    shared.mkdir()
    os.chmod(shared, 0o1777)
    assert private_folder(str(shared / "mine")) == str(shared / "mine")


def test_a_symbolic_link_of_another_user_is_refused(tmp_path):
    if os.geteuid() != 0:
        pytest.skip("needs root to give a symbolic link to another user")
    target = tmp_path / "target"
    target.mkdir(mode=0o700)
    link = tmp_path / "link"
    link.symlink_to(target)
    os.lchown(link, OTHER_UID, OTHER_UID)
    assert "symbolic link" in _refused(link)


def test_a_refused_folder_is_stood_in_for_by_a_private_one(tmp_path):
    folder = tmp_path / "cache"
    _wide_open(folder)
    with pytest.warns(CacheFolderWarning):
        stand_in = cache_folder_or_private(str(folder / "cpp"))
    assert not stand_in.startswith(str(tmp_path))
    assert os.path.isdir(stand_in) and private_folder(stand_in) == stand_in


def test_default_root_is_the_users_cache_folder(monkeypatch, tmp_path):
    monkeypatch.setattr(fireclay_ir.config, "cache_dir", "")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert cache_dirs.default_root() == str(tmp_path / "xdg" / "fireclay")
    monkeypatch.setenv("XDG_CACHE_HOME", "relative/ignored")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert cache_dirs.default_root() == str(tmp_path / "home" / ".cache" / "fireclay")
    monkeypatch.setattr(fireclay_ir.config, "cache_dir", str(tmp_path / "mine"))  # FIRECLAY_CACHE_DIR
    assert cache_dirs.default_root() == str(tmp_path / "mine")


def test_write_atomic_replaces_a_planted_link_instead_of_following_it(tmp_path):
    victim = tmp_path / "victim.txt"
    victim.write_text("keep me")
    folder = tmp_path / "cache"
    folder.mkdir(mode=0o700)
    (folder / "entry.json").symlink_to(victim)
    write_atomic(str(folder / "entry.json"), "new")
    assert victim.read_text() == "keep me"
    assert not (folder / "entry.json").is_symlink() and (folder / "entry.json").read_text() == "new"
    assert sorted(p.name for p in folder.iterdir()) == ["entry.json"]  # no temporary file left
