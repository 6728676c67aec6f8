"""Files and folders only their owner can read: secrets, state and anything under a shared temporary folder."""

from __future__ import annotations

import os
import secrets
import shutil
import stat
import tempfile
from pathlib import Path

_FOLDER = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


def user_temp(name: str) -> Path:
    """``$TMPDIR/<name>-<uid>``: a folder name of this user's in the shared temporary folder (a fixed name let
    another user stop everyone's training by creating it first; now they can only make ``private_dir`` refuse
    this one user's, with a message saying to point TMPDIR elsewhere)."""
    return Path(tempfile.gettempdir()) / f"{name}-{os.getuid()}"


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


def not_yours_alone(info: os.stat_result) -> str:
    """Why a folder with the status ``info`` is not this user's alone ('' if it is): another user owns it, or
    others may write in it (and so swap what is inside for a link)."""
    if info.st_uid != os.getuid():
        return f"owned by uid {info.st_uid}, not you"
    if info.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        return f"writable by others (mode {stat.S_IMODE(info.st_mode):o})"
    return ""


def _check_yours(fd: int, path: Path) -> None:
    problem = not_yours_alone(os.fstat(fd))
    if problem:
        raise PermissionError(f"{path} is {problem}: nothing under it is deleted")


def remove_inside(top: Path, rel: Path, prune: bool = True) -> None:
    """Delete the folder tree ``top/rel`` and (``prune``) the folders between it and ``top`` it leaves empty,
    through directory descriptors opened without following links, each folder on the way checked to be this
    user's and writable by nobody else. A delete by path let a user who could write a folder on the way swap
    it for a link to the victim's home between the check and the delete. A folder already gone is no error."""
    parts = rel.parts
    if not parts or rel.is_absolute() or any(part in (".", "..") for part in parts):
        raise ValueError(f"{rel} is not a path inside {top}")
    fds = [os.open(top, _FOLDER)]
    try:
        _check_yours(fds[0], top)
        for i, part in enumerate(parts[:-1]):
            try:
                fds.append(os.open(part, _FOLDER, dir_fd=fds[-1]))
            except FileNotFoundError:
                return
            _check_yours(fds[-1], top.joinpath(*parts[: i + 1]))
        try:
            shutil.rmtree(parts[-1], dir_fd=fds[-1])  # lstat, open, then compare: a link is refused, not followed
        except FileNotFoundError:
            pass
        for depth in range(len(parts) - 1, 0, -1) if prune else ():
            try:
                os.rmdir(parts[depth - 1], dir_fd=fds[depth - 1])
            except OSError:
                break  # not empty: another job still uses it
    finally:
        for fd in fds:
            os.close(fd)
