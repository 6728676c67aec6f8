"""Files and folders only their owner can read: secrets, state and anything under a shared temporary folder."""

from __future__ import annotations

import os
import secrets
from pathlib import Path


def write_private(path: Path, data: bytes) -> None:
    """Write ``path`` readable by its owner only, at every instant.

    The bytes go to a new temporary name created with O_CREAT|O_EXCL and mode 0600 (never
    an existing file, never a symlink), are fsynced, then renamed over ``path``.
    """
    tmp = path.with_name(f".{path.name}.{secrets.token_hex(8)}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def private_dir(path: Path, what: str = "this folder") -> Path:
    """``path`` created if needed and set to 0700; refused if it is a link or another user owns it
    (``what`` says what the folder is for, in the message)."""
    path.mkdir(mode=0o700, parents=True, exist_ok=True)
    if path.is_symlink() or not path.is_dir():
        raise NotADirectoryError(f"{path} ({what}) is a link or not a directory: remove it, or point TMPDIR elsewhere")
    if path.stat().st_uid != os.getuid():
        raise PermissionError(
            f"{path} ({what}) belongs to another user: it must be private to you; "
            "point TMPDIR (or the setting that names it) at a folder of your own"
        )
    os.chmod(path, 0o700)
    return path


def create_private(path: Path) -> None:
    """Create ``path`` empty with mode 0600 if it does not exist (a file another program fills, e.g. a
    database it would otherwise create readable by everyone)."""
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    except FileExistsError:
        return
    os.close(fd)
