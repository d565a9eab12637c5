"""Kernel files in the cache are never trusted: a planted ``k<sha>.py`` (in the user's own cache,
or in a folder another user can write) is not imported, a symbolic link planted at a temporary
file's name does not redirect the write, and the compiled program still matches eager."""

from __future__ import annotations

import hashlib
import os
import sys

import pytest
import torch
from aten_builder import AtenBuilder

import fireclay_ir
from fireclay_loops import cache_dirs
from fireclay_loops.cache_dirs import CacheFolderWarning
from fireclay_triton import Config, compile_program
from fireclay_triton.runtime import load_module

interpreted = pytest.mark.skipif(os.environ.get("TRITON_INTERPRET") != "1", reason="runs in Triton's interpreter")
OTHER_UID = 12345


@pytest.fixture(autouse=True)
def _fresh_verdicts():
    cache_dirs.forget_verdicts()
    yield
    cache_dirs.forget_verdicts()


def _program():
    b = AtenBuilder()
    x = b.input(torch.empty(4, 8, device="meta"), "x")
    return b.output(b.call("add.Tensor", b.call("tanh.default", x), 1.0)), b


def _digest(source: str) -> str:
    return hashlib.sha256(source.encode()).hexdigest()[:32]


@pytest.fixture(scope="module")
def kernel_source(tmp_path_factory):
    program, _ = _program()
    with fireclay_ir.config.patch(cache_dir=str(tmp_path_factory.mktemp("reference"))):
        compiled = compile_program(program, cfg=Config())
    return compiled.kernel_source


def _forget_module(source: str, monkeypatch) -> None:
    """As in a fresh process: the kernel module is not imported yet."""
    name = f"fireclay_triton_kernels_{_digest(source)}"
    if name in sys.modules:
        monkeypatch.delitem(sys.modules, name)


def _planted(source: str, mark) -> str:
    """The generated kernels, behind a line that marks the file when it is imported."""
    return f"open({str(mark)!r}, 'w').close()\n" + source


def _check_against_eager(compiled, b) -> None:
    x = torch.randn(4, 8)
    torch.testing.assert_close(compiled(x)[0], b.eager(x)[0])


@interpreted
@pytest.mark.parametrize("weaken", ["none", "root_0777", "root_of_another_user"])
def test_a_planted_kernel_file_is_never_imported(tmp_path, monkeypatch, kernel_source, weaken):
    root = tmp_path / "cache"
    kernels = root / "triton" / "kernels"
    kernels.mkdir(parents=True, mode=0o700)
    os.chmod(root, 0o700)
    mark = tmp_path / "planted-module-ran"
    path = kernels / f"k{_digest(kernel_source)}.py"
    path.write_text(_planted(kernel_source, mark))
    if weaken == "root_0777":
        os.chmod(root, 0o777)
    elif weaken == "root_of_another_user":
        if os.geteuid() == 0:
            os.chown(root, OTHER_UID, OTHER_UID)
        else:
            monkeypatch.setattr(cache_dirs, "_uid", lambda: os.geteuid() + 1)
    _forget_module(kernel_source, monkeypatch)
    program, b = _program()
    if weaken == "none":  # the user's own cache: the file is compared with the source and rewritten
        with fireclay_ir.config.patch(cache_dir=str(root)):
            compiled = compile_program(program, cfg=Config())
        assert path.read_text() == kernel_source
    else:
        with pytest.warns(CacheFolderWarning):
            with fireclay_ir.config.patch(cache_dir=str(root)):
                compiled = compile_program(program, cfg=Config())
        assert path.read_text() == _planted(kernel_source, mark)  # left alone, not used
    assert not mark.exists(), "a planted kernel file was imported"
    _check_against_eager(compiled, b)


def test_a_link_planted_at_a_temporary_name_does_not_redirect_the_write(tmp_path, monkeypatch):
    source = "VALUE = 42\n"
    folder = tmp_path / "kernels"
    folder.mkdir(mode=0o700)
    victim = tmp_path / "victim.txt"
    victim.write_text("keep me")
    path = folder / f"k{_digest(source)}.py"
    for name in (f"{path}.{os.getpid()}.tmp", f"{path}.tmp{os.getpid()}", f"{path}.tmp"):
        os.symlink(victim, name)  # every name a predictable writer might pick
    _forget_module(source, monkeypatch)
    module, _ = load_module(source, str(folder))
    assert module.VALUE == 42
    assert victim.read_text() == "keep me"
    assert path.read_text() == source and not path.is_symlink()


def test_a_stale_bytecode_cache_is_not_run(tmp_path, monkeypatch):
    """Only the compared source runs, never a ``__pycache__`` file beside it."""
    source = "VALUE = 1\n"
    folder = tmp_path / "kernels"
    folder.mkdir(mode=0o700)
    name = f"k{_digest(source)}"
    (folder / f"{name}.py").write_text(source)
    stat = os.stat(folder / f"{name}.py")
    import importlib.util
    from importlib._bootstrap_external import _code_to_timestamp_pyc

    pyc = importlib.util.cache_from_source(str(folder / f"{name}.py"))
    os.makedirs(os.path.dirname(pyc), exist_ok=True)
    code = compile("VALUE = 666\n", str(folder / f"{name}.py"), "exec")
    with open(pyc, "wb") as f:
        f.write(_code_to_timestamp_pyc(code, stat.st_mtime, stat.st_size))
    _forget_module(source, monkeypatch)
    module, _ = load_module(source, str(folder))
    assert module.VALUE == 1
