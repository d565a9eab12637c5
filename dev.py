#!/usr/bin/env python3
"""Run a nox session of this repository, bootstrapping nox into .tools/ if it is missing.

    python3 dev.py demo      # the main job end to end
    python3 dev.py tests     # every package alone, lint, integration tests
    python3 dev.py -l        # list the sessions
    python3 dev.py wheels    # build the eight packages' wheels into dist/ (not a nox session)

Arguments are passed to nox unchanged (a bare word is taken as a session name).
"""

from __future__ import annotations

import os
import pathlib
import subprocess
import sys
import venv

ROOT = pathlib.Path(__file__).resolve().parent
TOOLS = ROOT / ".tools"
NOX_PIN = "nox[uv]>=2024.4.15"


def _tools_python() -> pathlib.Path:
    return TOOLS / ("Scripts/python.exe" if os.name == "nt" else "bin/python")


def ensure_nox() -> pathlib.Path:
    python = _tools_python()
    if not python.exists():
        print(f"dev.py: creating {TOOLS} with nox", flush=True)
        venv.EnvBuilder(with_pip=True, clear=True).create(TOOLS)
    if subprocess.run([python, "-c", "import nox, uv"], capture_output=True).returncode != 0:
        subprocess.run([python, "-m", "pip", "install", "-q", NOX_PIN], check=True)
    return python


PACKAGES = ROOT / "packages"


def build_wheels(argv: list[str]) -> int:
    """``dev.py wheels [DEST]``: one wheel per package in DEST (default dist/), for
    ``pip install --find-links DEST fireclay-capture`` and the like."""
    dest = pathlib.Path(argv[0]) if argv else ROOT / "dist"
    python = pathlib.Path(sys.executable)
    if subprocess.run([python, "-m", "pip", "--version"], capture_output=True).returncode != 0:
        python = _tools_python()  # a Python without pip: use the tools environment's
        if not python.exists():
            venv.EnvBuilder(with_pip=True, clear=True).create(TOOLS)
    packages = sorted(p for p in PACKAGES.iterdir() if (p / "pyproject.toml").exists())
    dest.mkdir(parents=True, exist_ok=True)
    result = subprocess.run([python, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(dest), *map(str, packages)])
    if result.returncode == 0:
        print(f"dev.py: {len(packages)} wheels in {dest}; install with e.g. "
              f"pip install --find-links {dest} fireclay-capture")
    return result.returncode


def main(argv: list[str]) -> int:
    args = list(argv)
    if args[:1] == ["wheels"]:
        return build_wheels(args[1:])
    if args and not args[0].startswith("-"):
        args = ["-s", args[0], *args[1:]]
    python = ensure_nox()
    return subprocess.run([python, "-m", "nox", "-f", str(ROOT / "noxfile.py"), *args], cwd=ROOT).returncode


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
