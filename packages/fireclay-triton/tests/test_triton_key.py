"""Triton's version key is stored beside Triton's cache and reused while Triton's installation is
unchanged (fireclay_triton.triton_key)."""

import json
import os
import subprocess
import sys
import textwrap

import pytest

pytest.importorskip("triton")

from fireclay_triton.triton_key import FILE_NAME, installation_stamp  # noqa: E402

PROBE = textwrap.dedent("""
    import json
    import triton.runtime.cache as cache
    from fireclay_triton import triton_key
    installed = triton_key.install()
    print(json.dumps({"installed": installed, "now": cache.triton_key()}))
""")


def _probe(cache_dir):
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["TRITON_CACHE_DIR"] = str(cache_dir)
    done = subprocess.run([sys.executable, "-c", PROBE], env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_the_key_is_computed_once_then_read_back_while_the_stamp_matches(tmp_path):
    first = _probe(tmp_path)
    assert first["installed"] == first["now"] and first["now"]  # computed by Triton, then stored
    path = tmp_path / FILE_NAME
    stored = json.loads(path.read_text())
    assert stored["key"] == first["now"]

    path.write_text(json.dumps({"stamp": stored["stamp"], "key": "a stored key"}))
    assert _probe(tmp_path) == {"installed": "a stored key", "now": "a stored key"}  # read back, not hashed

    path.write_text(json.dumps({"stamp": "another installation", "key": "a stored key"}))
    assert _probe(tmp_path)["now"] == first["now"]  # a changed installation: hashed again
    assert json.loads(path.read_text()) == stored

    path.write_text("not json")
    assert _probe(tmp_path)["now"] == first["now"]


def test_the_stamp_follows_every_file_but_bytecode(tmp_path):
    (tmp_path / "pkg" / "__pycache__").mkdir(parents=True)
    (tmp_path / "pkg" / "a.py").write_text("x = 1\n")
    (tmp_path / "lib.so").write_bytes(b"\0" * 100)
    before = installation_stamp(str(tmp_path))
    (tmp_path / "pkg" / "__pycache__" / "a.pyc").write_bytes(b"cached")
    assert installation_stamp(str(tmp_path)) == before
    os.utime(tmp_path / "lib.so", ns=(1, 1))
    touched = installation_stamp(str(tmp_path))
    assert touched != before
    (tmp_path / "pkg" / "b.py").write_text("")
    assert installation_stamp(str(tmp_path)) != touched


def test_the_key_follows_file_contents_whatever_the_workers(tmp_path, monkeypatch):
    from fireclay_triton import triton_key

    monkeypatch.setattr(triton_key, "CHUNK", 16)  # files of several pieces
    (tmp_path / "lib.so").write_bytes(bytes(range(100)))
    (tmp_path / "a.py").write_text("x = 1\n")
    (tmp_path / "empty.py").write_text("")
    keys = {triton_key.installation_key(str(tmp_path), "3.6.0", workers) for workers in (1, 3)}
    assert len(keys) == 1
    key = keys.pop()
    assert key.startswith("3.6.0-") and triton_key.installation_key(str(tmp_path), "3.7.0") != key
    (tmp_path / "lib.so").write_bytes(bytes(range(99)) + b"\xff")  # the last piece changes
    changed = triton_key.installation_key(str(tmp_path), "3.6.0")
    assert changed != key
    (tmp_path / "empty.py").rename(tmp_path / "moved.py")
    assert triton_key.installation_key(str(tmp_path), "3.6.0") != changed
