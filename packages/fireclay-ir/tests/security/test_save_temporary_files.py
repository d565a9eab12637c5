"""``save`` writes through ``mkstemp`` files: a symbolic link planted at a predictable temporary
name beside the document or its weights does not redirect the write, and what is saved loads back."""

from __future__ import annotations

import math
import os
import stat
import sys

from fireclay_ir import dumps, load, save
from fireclay_ir.serde import weights_path

sys.path.insert(0, os.path.dirname(os.path.dirname(__file__)))
from format_samples import mlp_aten  # noqa: E402 - the package's sample programs, one folder up


def _with_weights():
    prog = mlp_aten(batch=4)
    for w in prog.weights.values():
        w.data = bytes(4 * math.prod(w.meta.shape))  # float32 zeros
    return prog


def test_planted_links_at_temporary_names_are_not_followed(tmp_path):
    prog = _with_weights()
    path = tmp_path / "p.fcir.json"
    victim = tmp_path / "victim.txt"
    victim.write_text("keep me")
    for target in (str(path), weights_path(path)):
        for name in (f"{target}.tmp{os.getpid()}", f"{target}.{os.getpid()}.tmp", f"{target}.tmp"):
            os.symlink(victim, name)
    save(prog, path)
    assert victim.read_text() == "keep me"
    assert dumps(load(path)) == dumps(prog)
    assert os.path.exists(weights_path(path)) and not os.path.islink(weights_path(path))
    leftovers = {p.name for p in tmp_path.iterdir()} - {"p.fcir.json", os.path.basename(weights_path(path)),
                                                        "victim.txt"}
    assert all(os.path.islink(tmp_path / n) for n in leftovers)  # only the planted links


def test_saved_files_get_the_usual_permissions(tmp_path):
    old = os.umask(0o022)
    try:
        save(_with_weights(), tmp_path / "p.fcir.json")
    finally:
        os.umask(old)
    for p in (tmp_path / "p.fcir.json", weights_path(tmp_path / "p.fcir.json")):
        assert stat.S_IMODE(os.stat(p).st_mode) & 0o644 == 0o644
