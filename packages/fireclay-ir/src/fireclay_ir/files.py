"""Writing files so that no reader sees half of one and no planted link redirects the write."""

from __future__ import annotations

import os
import tempfile
from collections.abc import Iterable

__all__ = ["write_atomic"]


def _umask() -> int:
    mask = os.umask(0o077)
    os.umask(mask)
    return mask


_UMASK = _umask()  # read once, at import: reading it means setting it, which threads would race


def write_atomic(path: str | os.PathLike[str], data: str | bytes | Iterable[bytes | bytearray], *,
                 shared: bool = False) -> None:
    """Write ``data`` (text, bytes, or chunks of bytes) to ``path`` through a temporary file made by
    ``mkstemp`` in its folder (an unpredictable name, created exclusively: a symbolic link planted
    beside ``path`` cannot redirect the write), renamed into place. The file is this user's alone
    (mode 0600, what caches of code need) unless ``shared``: then it gets the usual permissions
    (0666 less the umask), as a document the user saves."""
    fd, tmp = tempfile.mkstemp(prefix=f".{os.path.basename(os.fspath(path))}.", suffix=".tmp",
                               dir=os.path.dirname(os.path.abspath(path)))
    try:
        with os.fdopen(fd, "w" if isinstance(data, str) else "wb") as f:
            if isinstance(data, (str, bytes)):
                f.write(data)
            else:
                for chunk in data:
                    f.write(chunk)
            if shared and hasattr(os, "fchmod"):  # POSIX: mkstemp made it 0600
                os.fchmod(f.fileno(), 0o666 & ~_UMASK)
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
