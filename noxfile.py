"""Build, install and test each fireclay stage on its own; run the demo and the benchmarks.

Each package session installs only that package and the siblings it declares into a fresh
environment, then runs its tests there: that is the proof that the package installs alone.
Packages whose torch use is optional are tested twice: first without torch, then with it.
"""

from __future__ import annotations

import functools
import os
import pathlib
import shutil
import subprocess
import sys

import nox

ROOT = pathlib.Path(__file__).parent

# uv builds each environment in seconds by linking packages from its cache, so every session
# still gets a fresh environment of its own (the isolation proof) without paying for a full torch
# install each time. Without uv, nox falls back to venv + pip.
nox.options.default_venv_backend = "uv|venv"
nox.options.reuse_existing_virtualenvs = False
nox.options.sessions = ["tests"]

# session name -> (distribution, siblings it declares, extra that adds torch if torch is optional)
PACKAGES: dict[str, tuple[str, tuple[str, ...], str | None]] = {
    "ir": ("fireclay-ir", (), "torch"),
    "shapes": ("fireclay-shapes", (), None),
    "capture": ("fireclay-capture", ("fireclay-ir", "fireclay-shapes"), None),
    "autograd": ("fireclay-autograd", ("fireclay-ir", "fireclay-shapes"), None),
    "loops": ("fireclay-loops", ("fireclay-ir", "fireclay-shapes"), "torch"),
    "cpp": ("fireclay-cpp", ("fireclay-ir", "fireclay-shapes", "fireclay-loops"), None),
    "triton": ("fireclay-triton", ("fireclay-ir", "fireclay-shapes", "fireclay-loops"), None),
    "fireclay": (
        "fireclay",
        ("fireclay-ir", "fireclay-shapes", "fireclay-capture", "fireclay-autograd",
         "fireclay-loops", "fireclay-cpp", "fireclay-triton"),
        None,
    ),
}
ALL_DISTS = [dist for dist, _, _ in PACKAGES.values()]


@functools.cache
def _pip_find_links() -> tuple[str, ...]:
    """pip's configured find-links (a local wheel folder), passed on so uv sees it too."""
    links = os.environ.get("UV_FIND_LINKS") or os.environ.get("PIP_FIND_LINKS")
    if not links:
        try:
            links = subprocess.run([sys.executable, "-m", "pip", "config", "get", "global.find-links"],
                                   capture_output=True, text=True, timeout=60).stdout.strip()
        except (OSError, subprocess.SubprocessError):
            links = ""
    return tuple(arg for link in links.split() for arg in ("--find-links", link))


def _install(session: nox.Session, *args: str) -> None:
    """Install into the session's environment with the repository's pins."""
    session.install("-c", str(ROOT / "constraints.txt"), *_pip_find_links(), *args)


def _path(dist: str) -> str:
    return str(ROOT / "packages" / dist)


def _pytest(session: nox.Session, *where: str) -> None:
    session.run("python", "-m", "pytest", "-q", "-p", "no:cacheprovider", *where, *session.posargs)


def _package_session(name: str, dist: str, siblings: tuple[str, ...], torch_extra: str | None):
    def run(session: nox.Session) -> None:
        tests = str(ROOT / "packages" / dist / "tests")
        # Siblings install from this checkout (not as editable), the package with its test extra.
        _install(session, *(_path(s) for s in siblings), f"{_path(dist)}[test]")
        if torch_extra:
            # The torch-free core first: tests that need torch skip themselves here.
            _pytest(session, tests)
            _install(session, f"{_path(dist)}[test,{torch_extra}]")
            # With torch installed, importing the package still must not import it.
            module = dist.replace("-", "_")
            session.run("python", "-c", f"import sys, {module}; assert 'torch' not in sys.modules, "
                        f"'import {module} imported torch'")
        _pytest(session, tests)

    run.__doc__ = f"Install {dist} alone (with {', '.join(siblings) or 'no siblings'}) and run its tests."
    return nox.session(name=name, python=None)(run)


for _name, (_dist, _siblings, _extra) in PACKAGES.items():
    globals()[f"package_{_name}"] = _package_session(_name, _dist, _siblings, _extra)


def _install_everything(session: nox.Session, *extra: str) -> None:
    _install(session, *(_path(d) for d in ALL_DISTS), *extra)


def _uv_binary() -> str | None:
    """The uv nox builds environments with (the install walkthrough makes fresh ones with it)."""
    try:
        from nox.virtualenv import UV  # nox's own uv, found or installed with nox[uv]
    except ImportError:
        UV = None
    return UV if UV and os.path.exists(str(UV)) else shutil.which("uv")


@nox.session
def integration(session: nox.Session) -> None:
    """All packages together: end-to-end tests over real models, for correctness."""
    _install_everything(session, "pytest", "pytest-xdist", "hypothesis", "transformers>=4.40")
    uv = _uv_binary()
    if uv:
        session.env["FIRECLAY_UV"] = str(uv)
    _pytest(session, "-n", "2", str(ROOT / "integration_tests"))


def _torch_pin() -> str:
    """The repository's torch pin (constraints.txt), alone."""
    lines = (ROOT / "constraints.txt").read_text().splitlines()
    return next(line.strip() for line in lines if line.startswith("torch=="))


@nox.session(name="capture-py313", python="3.13", reuse_venv=True)
def capture_py313(session: nox.Session) -> None:
    """fireclay-capture's conformance and break corpora on CPython 3.13 (not part of ``tests``).

    torch for 3.13 comes from the registry as its CUDA build (several GB), so this environment is
    kept and reused between runs instead of being rebuilt like the package sessions' ones. nox
    needs a ``python3.13`` on PATH (with pyenv: ``PYENV_VERSION=3.11.7:3.13.0``)."""
    # Not through _install: a local wheel folder holds torch for this machine's default Python
    # only (uv takes a package from the first place that has it), and the registry's CUDA build of
    # torch brings its own triton, which the repository's triton pin would refuse.
    session.install(*(_path(d) for d in ("fireclay-ir", "fireclay-shapes")),
                    f"{_path('fireclay-capture')}[test]", _torch_pin())
    tests = ROOT / "packages" / "fireclay-capture" / "tests"
    _pytest(session, str(tests / "test_corpus.py"), str(tests / "test_graph_breaks.py"))


@nox.session(name="torch-2.14", venv_backend="venv", reuse_venv=True)
def torch_214(session: nox.Session) -> None:
    """The stages that follow torch's internals (shapes, capture, autograd, loops) on torch 2.14
    (not part of ``tests``, which runs the pin in constraints.txt).

    pip on this machine's Python 3.11 finds torch 2.14.1 on local disk; it is a CUDA build (several
    GB), so the environment is kept between runs. venv + pip, not uv: uv does not look there. No
    fireclay-triton: that torch build pins a triton of its own."""
    stages = ("fireclay-shapes", "fireclay-capture", "fireclay-autograd", "fireclay-loops")
    session.install(_path("fireclay-ir"), *(_path(d) for d in stages), f"{_path('fireclay-capture')}[test]",
                    "torch==2.14.1")
    for dist in stages:  # one run each: the packages' test modules share names
        _pytest(session, str(ROOT / "packages" / dist / "tests"))


@nox.session
def lint(session: nox.Session) -> None:
    """ruff over the whole repository (ruff.toml), the import-cycle check of every package
    (scripts/import_cycles.py: no cycle over 3 files) and the type checker (mypy.ini: strict on
    fireclay-ir and fireclay-loops, mypy's defaults elsewhere)."""
    _install(session, "ruff", "mypy")
    session.run("ruff", "check", str(ROOT))
    session.run("python", str(ROOT / "scripts" / "import_cycles.py"))
    session.chdir(ROOT)  # mypy.ini names the packages' source folders from the repository root
    session.run("mypy", "--config-file", str(ROOT / "mypy.ini"))


@nox.session
def tests(session: nox.Session) -> None:
    """Everything: lint, each package alone, then the integration tests."""
    session.notify("lint")
    for name in PACKAGES:
        session.notify(name)
    session.notify("integration")


@nox.session
def demo(session: nox.Session) -> None:
    """The main job end to end, as far as the stages reach today."""
    _install_everything(session, "transformers>=4.40")
    session.run("python", str(ROOT / "demo.py"), *session.posargs)


@nox.session
def bench(session: nox.Session) -> None:
    """The benchmark suite; arguments after -- go to benchmarks.run."""
    _install_everything(session, "transformers>=4.40")
    session.chdir(str(ROOT))
    session.run("python", "-m", "benchmarks.run", *(session.posargs or ["--suite", "quick"]))
