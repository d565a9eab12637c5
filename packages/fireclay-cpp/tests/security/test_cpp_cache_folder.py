"""A compile cache another local user could write is never used: a library planted there with a
forged record (its size and sha256 match, it even answers the right cache key) is not loaded, and
the compiled program still matches eager. Folders fireclay-cpp makes are 0700."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import stat
import subprocess

import pytest
import torch
from aten_builder import AtenBuilder

import fireclay_cpp
import fireclay_ir
from fireclay_loops import cache_dirs
from fireclay_loops.cache_dirs import CacheFolderWarning

OTHER_UID = 12345

# A library that marks a file as soon as it is loaded (a constructor runs at dlopen) and answers
# whatever cache key it is told to: only the folder check can keep it out.
PLANTED = r"""
#include <cstdio>
#include <cstdlib>
__attribute__((constructor)) static void fc_planted() {
    const char* mark = getenv("FC_PLANTED_MARK");
    if (mark) { FILE* f = fopen(mark, "w"); if (f) fclose(f); }
}
extern "C" const char* fc_cache_key() { const char* k = getenv("FC_PLANTED_KEY"); return k ? k : ""; }
"""


@pytest.fixture(scope="module")
def planted_library(tmp_path_factory):
    folder = tmp_path_factory.mktemp("planted")
    (folder / "planted.cpp").write_text(PLANTED)
    so = folder / "planted.so"
    subprocess.run([fireclay_cpp.config.resolved_compiler(), "-shared", "-fPIC", str(folder / "planted.cpp"), "-o",
                    str(so)], check=True, timeout=120)
    return so


@pytest.fixture(scope="module")
def cache_keys(tmp_path_factory):
    """The cache keys of ``_program``'s libraries (compiled once, in a cache of its own)."""
    program, _, xs = _program()
    with fireclay_ir.config.patch(cache_dir=str(tmp_path_factory.mktemp("reference"))):
        return [lib.key for lib in fireclay_cpp.compile_program(program, xs).libraries]


@pytest.fixture(autouse=True)
def _fresh_verdicts():
    cache_dirs.forget_verdicts()
    yield
    cache_dirs.forget_verdicts()


def _program():
    gen = torch.Generator().manual_seed(0)
    xs = [torch.randn(5, 8, generator=gen), torch.randn(8, 3, generator=gen), torch.randn(3, generator=gen)]
    b = AtenBuilder()
    x, w, bias = (b.input(t, n) for t, n in zip(xs, "xwb"))
    h = b.call("addmm.default", bias, x, w)
    return b.output(b.call("tanh.default", h)), b, xs


def _give_away(path, monkeypatch) -> None:
    if os.geteuid() == 0:
        os.chown(path, OTHER_UID, OTHER_UID)
    else:  # every folder of this user now counts as another user's
        monkeypatch.setattr(cache_dirs, "_uid", lambda: os.geteuid() + 1)


def _plant(root, keys, so) -> None:
    """The attacker's entries: the library and a record matching it, for each key."""
    data = so.read_bytes()
    record = {"size": len(data), "sha256": hashlib.sha256(data).hexdigest()}
    for key in keys:
        folder = root / "cpp" / key[:2]
        folder.mkdir(parents=True, exist_ok=True)
        shutil.copy(so, folder / f"{key}.so")
        (folder / f"{key}.json").write_text(json.dumps(record))


def _open_root(root, monkeypatch) -> None:
    os.chmod(root, 0o777)


def _root_of_another_user(root, monkeypatch) -> None:
    _give_away(root, monkeypatch)


def _open_subfolder(root, monkeypatch) -> None:
    for sub in (root / "cpp").iterdir():
        os.chmod(sub, 0o777)


def _open_parent(root, monkeypatch) -> None:
    os.chmod(root.parent, 0o777)


@pytest.mark.parametrize("weaken", [_open_root, _root_of_another_user, _open_subfolder, _open_parent],
                         ids=["root_0777", "root_of_another_user", "entry_folder_0777", "parent_0777"])
def test_a_library_planted_in_a_cache_others_can_write_is_not_loaded(tmp_path, monkeypatch, planted_library,
                                                                     cache_keys, weaken):
    program, b, xs = _program()
    keys = cache_keys
    root = tmp_path / "shared" / "cache"
    root.mkdir(parents=True)
    _plant(root, keys, planted_library)
    weaken(root, monkeypatch)
    mark = tmp_path / "planted-library-ran"
    monkeypatch.setenv("FC_PLANTED_MARK", str(mark))
    monkeypatch.setenv("FC_PLANTED_KEY", keys[0])
    monkeypatch.setattr(fireclay_ir.config, "cache_dir", str(root))
    with pytest.warns(CacheFolderWarning, match="not using the compile cache folder"):
        compiled = fireclay_cpp.compile_program(program, xs)
    assert not mark.exists(), "a library planted in the cache was loaded"
    assert all(not lib.path.startswith(str(root)) for lib in compiled.libraries)
    fresh = [torch.randn_like(t) for t in xs]
    for got, want in zip(compiled(*fresh), b.eager(*fresh)):
        torch.testing.assert_close(got, want)


def test_cache_folders_are_made_private(tmp_path):
    program, b, xs = _program()
    old = os.umask(0o022)
    try:
        with fireclay_ir.config.patch(cache_dir=str(tmp_path / "c")):
            compiled = fireclay_cpp.compile_program(program, xs)
    finally:
        os.umask(old)
    folder = os.path.dirname(compiled.libraries[0].path)
    for path in (tmp_path / "c", tmp_path / "c" / "cpp", folder):
        assert stat.S_IMODE(os.stat(path).st_mode) == 0o700, path
    # nothing but the entries and their lock: no temporary file left behind
    assert {os.path.splitext(n)[1] for n in os.listdir(folder)} <= {".cpp", ".so", ".json", ".lock"}
