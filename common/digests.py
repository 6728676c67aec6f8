"""sha256 of files and folders, and how a folder differs from a recorded list: the one way every stage
checks that what it reads is what was committed (checkpoints, the Hugging Face export, datasets)."""

from __future__ import annotations

import hashlib
from pathlib import Path

from common.errors import UserError


class IntegrityError(UserError):
    """Files differ from the digests recorded when they were written: nothing of them is read."""


def file_sha256(path: Path) -> str:
    with open(path, "rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


def folder_files(folder: Path) -> list[str]:
    """Relative paths of the files under ``folder``, sorted."""
    return sorted(p.relative_to(folder).as_posix() for p in folder.rglob("*") if p.is_file())


def folder_digests(folder: Path) -> dict[str, str]:
    """``{relative path: sha256}`` of every file under ``folder``."""
    return {rel: file_sha256(folder / rel) for rel in folder_files(folder)}


def digest_problems(folder: Path, expected: dict[str, str], listing: str, skip: frozenset[str] = frozenset()) -> list[str]:
    """How ``folder`` differs from ``expected`` (``{relative path: sha256}``, recorded in ``listing``): files
    not listed, listed files missing, files whose sha256 differs; [] when it holds exactly those bytes.
    Files named in ``skip`` (the listing itself, a commit marker) are not compared."""
    present = {rel for rel in folder_files(folder) if rel not in skip}
    problems = [f"{rel} is not listed in {listing} (not committed with it)" for rel in sorted(present - expected.keys())]
    problems += [f"{rel} is missing" for rel in sorted(expected.keys() - present)]
    for rel in sorted(present & expected.keys()):
        actual = file_sha256(folder / rel)
        if actual != expected[rel]:
            problems.append(f"{rel} has sha256 {actual}, {listing} records {expected[rel]}")
    return problems


def require_digests(folder: Path, digests: dict[str, str], what: str, listing: str) -> None:
    """Raise IntegrityError unless ``folder`` (``what``, downloaded) holds exactly the files ``digests``
    (recorded in ``listing`` when they were written) lists, with those bytes."""
    if not digests:
        raise IntegrityError(
            f"{what} has no recorded digests ({listing}): its files cannot be checked, so it is not read; write it again"
        )
    problems = digest_problems(folder, digests, listing)
    if problems:
        raise IntegrityError(
            f"{what} is not what was written: {'; '.join(problems)}. It was modified afterwards; nothing of it was read"
        )
