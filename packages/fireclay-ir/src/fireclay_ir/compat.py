"""Lockstep version checks between fireclay distributions.

All fireclay distributions are released together with the same version. A package that uses a
sibling calls :func:`require_sibling` at import time, so that a mismatched install fails at once
with the exact command that fixes it, rather than later with an obscure error.
"""

from __future__ import annotations

import importlib


class IncompatibleSiblingError(ImportError):
    """A fireclay distribution was found at a version its sibling cannot work with."""


def _major_minor(version: str) -> tuple[int, int]:
    parts = version.split(".")
    try:
        return int(parts[0]), int(parts[1])
    except (IndexError, ValueError) as exc:
        raise IncompatibleSiblingError(f"unreadable version string {version!r}") from exc


def require_sibling(user: str, user_version: str, import_name: str, dist_name: str) -> None:
    """Check that sibling ``import_name`` has the same MAJOR.MINOR version as ``user``.

    ``user`` is the distribution doing the check (for the message); ``dist_name`` is the
    sibling's distribution name, used in the suggested install command.
    """
    module = importlib.import_module(import_name)
    found = getattr(module, "__version__", "0.0.0")
    if _major_minor(found) != _major_minor(user_version):
        want = ".".join(str(p) for p in _major_minor(user_version))
        raise IncompatibleSiblingError(
            f"{user} {user_version} needs {dist_name} {want}.x, but {dist_name} {found} is "
            f"installed; run: pip install '{dist_name}=={want}.*'"
        )
