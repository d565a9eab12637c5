"""The on-disk cache: hits, keys, corrupt entries, concurrent builders, compiler errors, and the
parallel build of several libraries."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest
import torch

import fireclay_cpp
import fireclay_ir
from fireclay_cpp import BuildError, Config, build_libraries, build_library, cache_key


@pytest.fixture(autouse=True)
def cache_root(tmp_path, monkeypatch):
    """Each test caches under its own folder: the shared cache root (``FIRECLAY_CACHE_DIR``)."""
    monkeypatch.setattr(fireclay_ir.config, "cache_dir", str(tmp_path))


def _source(tag: int) -> str:
    return f'#include <cstdint>\nextern "C" int64_t answer() {{ return {tag}; }}\n'


def _answer(lib) -> int:
    lib.handle.answer.restype = __import__("ctypes").c_int64
    return lib.handle.answer()


def test_second_build_hits_the_cache(tmp_path):
    cfg = Config()
    first = build_library(_source(41), cfg)
    second = build_library(_source(41), cfg)
    assert not first.cached and first.seconds > 0
    assert second.cached and second.seconds == 0 and second.path == first.path
    assert _answer(second) == 41
    assert first.path.startswith(str(tmp_path))


def test_key_depends_on_source_flags_and_compiler(tmp_path):
    base = Config()
    keys = {cache_key(_source(1), base), cache_key(_source(2), base),
            cache_key(_source(1), Config(extra_flags="-DFOO"))}
    assert len(keys) == 3
    assert cache_key(_source(1), base) == cache_key(_source(1), Config())


def _build_elsewhere(source: str, cache_dir: str) -> str:
    """Build in another process (damaging a library this process has loaded would crash it)."""
    script = "import sys; import fireclay_ir; from fireclay_cpp import Config, build_library; " \
             "fireclay_ir.config.cache_dir = sys.argv[2]; print(build_library(sys.argv[1], Config()).path)"
    out = subprocess.run([sys.executable, "-c", script, source, cache_dir], capture_output=True, text=True,
                         timeout=300)
    assert out.returncode == 0, out.stderr
    return out.stdout.strip()


@pytest.mark.parametrize("damage", ["truncate", "garbage", "delete_record"])
def test_corrupt_entry_is_rebuilt(tmp_path, damage):
    cfg = Config()
    path = _build_elsewhere(_source(7), str(tmp_path))
    size = os.path.getsize(path)
    if damage == "truncate":
        with open(path, "r+b") as f:
            f.truncate(100)
    elif damage == "garbage":
        with open(path, "wb") as f:
            f.write(b"\x7fELF not really a library")
    else:
        os.unlink(path[:-3] + ".json")
    again = build_library(_source(7), cfg)
    assert again.path == path and not again.cached  # the compiler ran again
    assert os.path.getsize(again.path) == size
    assert _answer(again) == 7
    assert build_library(_source(7), cfg).cached


def test_concurrent_builds_of_one_key(tmp_path):
    """Two processes build the same key at once: both get a working library, the entry is
    valid, and the compiler ran at most... once per process (the second usually finds it built)."""
    script = textwrap.dedent(f"""
        import ctypes, sys
        import fireclay_ir
        from fireclay_cpp import Config, build_library
        fireclay_ir.config.cache_dir = sys.argv[1]
        lib = build_library({_source(99)!r} + "// " + "x" * 20000 + "\\n", Config())
        lib.handle.answer.restype = ctypes.c_int64
        print(lib.handle.answer(), lib.cached)
    """)
    procs = [subprocess.Popen([sys.executable, "-c", script, str(tmp_path)], stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True) for _ in range(2)]
    outs = [p.communicate(timeout=300) for p in procs]
    assert all(p.returncode == 0 for p in procs), outs
    answers = [o[0].split() for o in outs]
    assert all(a[0] == "99" for a in answers)
    assert [a[1] for a in answers].count("False") >= 1  # someone compiled
    cfg = Config()
    assert build_library(_source(99) + "// " + "x" * 20000 + "\n", cfg).cached
    leftovers = [f for _, _, files in os.walk(tmp_path) for f in files if f.endswith(".tmp")]
    assert leftovers == []


def test_compiler_error_is_reported_with_the_source_path(tmp_path):
    with pytest.raises(BuildError, match=r"the C\+\+ compiler failed on .*\.cpp"):
        build_library('extern "C" int broken( {', Config())


def test_missing_compiler_says_what_to_do(tmp_path):
    with pytest.raises(BuildError, match="FIRECLAY_CPP_COMPILER"):
        build_library(_source(1), Config(compiler="no-such-compiler-fc"))


def test_several_libraries_build_in_parallel(tmp_path):
    libs = build_libraries([_source(i) for i in range(3)] + [_source(0)], Config())
    assert [_answer(lib) for lib in libs] == [0, 1, 2, 0]
    assert libs[0].path == libs[3].path
    assert all(not lib.cached for lib in libs)


def test_program_compile_hits_cache_in_the_shared_root(tmp_path):
    from aten_builder import AtenBuilder

    x = torch.randn(5, 6)
    b = AtenBuilder()
    program = b.output(b.call("tanh.default", b.input(x)))
    cold = fireclay_cpp.compile_program(program)
    warm = fireclay_cpp.compile_program(program)
    assert not cold.cache_hit and warm.cache_hit
    assert warm.libraries[0].path.startswith(str(tmp_path))
    torch.testing.assert_close(warm(x)[0], torch.tanh(x))
