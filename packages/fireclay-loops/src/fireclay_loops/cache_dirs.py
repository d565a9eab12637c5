"""Where compiled artifacts are kept on disk, and when a folder may be trusted with them.

Every package that writes a cache (fireclay-cpp's libraries, fireclay-triton's kernel modules and
tuning results, the umbrella's stage artifacts) keeps it in a subfolder of one root:

* ``fireclay_ir.config.cache_dir`` (``FIRECLAY_CACHE_DIR``) when set, else ``$XDG_CACHE_HOME/fireclay`` (an absolute
  ``XDG_CACHE_HOME`` only, as the XDG specification asks), else ``~/.cache/fireclay`` (without a
  home folder: ``<tempdir>/fireclay-<uid>``, which another user may have made first: the check
  below then refuses it).

A cache holds code this process loads and runs (shared libraries, Python modules), so it must be
the user's own. :func:`private_folder` creates missing folders (the root among them) with mode
0700 and trusts a folder only if

* it is owned by this user and writable by no one else (group and others have no write bit);
* every folder above it is owned by this user or by root and is not writable by others, unless
  it has the sticky bit (``/tmp``: no one can rename or remove what another user made in it), so
  no one else can swap the folder for another; and
* every symbolic link on the way is owned by this user or by root (a link another user owns can
  be pointed elsewhere at any time).

Callers check each folder they read from or write to (a package's folder, then an entry's
subfolder: a subfolder planted before its parent was private fails on its own). A folder that
fails is not used: one warning names it and says why, and the caller goes on without a disk
cache (:func:`cache_folder_or_private` hands out a folder inside a private one made with
``tempfile.mkdtemp`` for this process, removed at exit). Verdicts are kept for the process: a
folder owned by this user (or root) cannot be handed to someone else without this user's (or
root's) doing.

Files are written with :func:`fireclay_ir.files.write_atomic`: a temporary file made with
``tempfile.mkstemp`` in the target folder (an unpredictable name, created exclusively, so a planted
symbolic link cannot redirect the write), then renamed over the target.
"""

from __future__ import annotations

import atexit
import os
import shutil
import stat
import tempfile
import threading
import warnings

from fireclay_ir.config import config as shared_config

__all__ = ["CacheFolderWarning", "cache_folder_or_private", "default_root", "folder_problem", "private_folder"]

_lock = threading.Lock()
_verdicts: dict[str, str | None] = {}  # folder -> the problem found, None if none
_warned: set[str] = set()  # folders warned about
_private: list[str] = []  # this process's fallback folder, once made


class CacheFolderWarning(UserWarning):
    """A cache folder another user could write: it is not used."""


def _uid() -> int:
    """Whose folders are trusted: this process's effective user (a test may substitute another)."""
    return os.geteuid()


def default_root() -> str:
    """The cache root: ``fireclay_ir.config.cache_dir`` (``FIRECLAY_CACHE_DIR``), else
    ``$XDG_CACHE_HOME/fireclay``, else ``~/.cache/fireclay``."""
    explicit = shared_config.cache_dir
    if explicit:
        return os.path.abspath(str(explicit))
    xdg = os.environ.get("XDG_CACHE_HOME", "")
    if os.path.isabs(xdg):
        return os.path.join(xdg, "fireclay")
    home = os.path.expanduser("~")
    if os.path.isabs(home):
        return os.path.join(home, ".cache", "fireclay")
    # no home folder: a per-user folder in the temporary folder, checked like any other
    return os.path.join(tempfile.gettempdir(), f"fireclay-{_uid() if _checks_apply() else 'user'}")


def _checks_apply() -> bool:
    return hasattr(os, "geteuid") and os.name == "posix"


def _describe(path: str, st: os.stat_result) -> str:
    return f"{path} (owner uid {st.st_uid}, mode {stat.S_IMODE(st.st_mode):04o})"


def folder_problem(folder: str) -> str | None:
    """Why the existing ``folder`` may not hold a cache, or None if it may. Nothing is created."""
    if not _checks_apply():
        return None
    me = _uid()
    # symbolic links on the way as written: each must be this user's or root's
    parts = os.path.abspath(folder).split(os.sep)
    for i in range(2, len(parts) + 1):
        prefix = os.sep.join(parts[:i])
        st = os.lstat(prefix)
        if stat.S_ISLNK(st.st_mode) and st.st_uid not in (me, 0):
            return f"the symbolic link {_describe(prefix, st)} belongs to another user"
    path = os.path.realpath(folder)
    st = os.stat(path)
    if not stat.S_ISDIR(st.st_mode):
        return f"{path} is not a folder"
    if st.st_uid != me:
        return f"{_describe(path, st)} belongs to another user"
    if st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        return f"{_describe(path, st)} is writable by other users"
    # the folders above: no one else may rename or replace what is below them
    while True:
        parent = os.path.dirname(path)
        if parent == path:
            return None
        path = parent
        st = os.stat(path)
        if st.st_uid not in (me, 0):
            return f"the folder above it, {_describe(path, st)}, belongs to another user"
        if st.st_mode & (stat.S_IWGRP | stat.S_IWOTH) and not st.st_mode & stat.S_ISVTX:
            return f"the folder above it, {_describe(path, st)}, is writable by other users"


def _make(folder: str) -> None:
    """Create ``folder`` and its missing parents, each with mode 0700 (whatever the umask)."""
    missing = []
    path = os.path.abspath(folder)
    while not os.path.lexists(path):
        missing.append(path)
        path = os.path.dirname(path)
    for path in reversed(missing):
        try:
            os.mkdir(path, 0o700)
        except FileExistsError:  # made meanwhile by another process: checked like any other
            continue
        os.chmod(path, 0o700)


def _warn_once(folder: str, problem: str) -> None:
    with _lock:
        if folder in _warned:
            return
        _warned.add(folder)
    warnings.warn(f"fireclay: not using the compile cache folder {folder}: {problem}. Compiling without "
                  "the disk cache; give the folder to this user with mode 0700, or set FIRECLAY_CACHE_DIR "
                  "to a folder of your own.", CacheFolderWarning, stacklevel=3)


def private_folder(folder: str) -> str | None:
    """``folder`` (absolute), created with mode 0700 where missing, if it may hold a cache; else
    None, after one warning (per process and folder)."""
    folder = os.path.abspath(folder)
    if folder in _verdicts and os.path.isdir(folder):
        problem = _verdicts[folder]
    else:
        try:
            _make(folder)
            problem = folder_problem(folder)
        except OSError as e:
            problem = f"it cannot be made or read ({type(e).__name__}: {e})"
        _verdicts[folder] = problem
    if problem is None:
        return folder
    _warn_once(folder, problem)
    return None


def _private_fallback() -> str:
    with _lock:
        if not _private:
            made = tempfile.mkdtemp(prefix="fireclay-private-")
            atexit.register(shutil.rmtree, made, True)
            _private.append(made)
        return _private[0]


def cache_folder_or_private(folder: str) -> str:
    """``folder`` if :func:`private_folder` accepts it, else a folder standing for it inside this
    process's private temporary folder (made by ``mkdtemp``, removed at exit)."""
    found = private_folder(folder)
    if found is not None:
        return found
    fallback = os.path.join(_private_fallback(), os.path.abspath(folder).lstrip(os.sep))
    _make(fallback)
    return fallback


def forget_verdicts() -> None:
    """Drop the kept verdicts and warnings (tests that change folders between checks)."""
    with _lock:
        _verdicts.clear()
        _warned.clear()
