"""Where checkpoints are staged on local disk, and whose a staging folder is. Torch-free: ``pretrain gc``
(``cli.retention``) reads the same names to find and judge the leftovers of jobs that are gone.

``$TMPDIR/pretrain-staging-<uid>/<store hash>/<job>/`` is one job's folder (``training.checkpointing.checkpoint``):
private to the job, shared by the ranks of a node, with an owner record (host, boot, pid). The root is
the user's own (0700, not a link), checked each time a job folder is made.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

from common.private import private_dir, remove_inside, user_temp
from runs import lease

STAGING = "pretrain-staging"
"""The folder under ``$TMPDIR`` that holds every job's staging folder, with the user's uid (``user_temp``)."""
KEPT_PREFIX = "kept-"
"""Beside the jobs' folders: ``kept-<run id>``, a run's newest committed checkpoints kept for a restart on this node
(``training.checkpointing.local_copy``); no owner record, so the sweep of dead jobs' folders leaves it."""
STAGING_OWNER = ".owner"
"""In a job's staging folder: which process (host, boot, pid) made it, for the sweep of leftovers."""


def root() -> Path:
    return user_temp(STAGING)


def store_root(store_uri: str) -> Path:
    """The staging folder of one store's jobs: two stores can hold runs with the same id (tests, copies)."""
    return root() / hashlib.sha256(store_uri.encode()).hexdigest()[:12]


def make_job_folder(folder: Path) -> None:
    """Create a job's staging folder ``<root>/<store hash>/<job>`` with its owner record, after removing
    the leftovers of processes of this host that no longer exist (a SIGKILLed job never cleans up).
    The root, in the shared temporary folder, must be this user's own, 0700 and not a link: another
    user could otherwise read the checkpoints or plant links for ``pretrain gc`` to follow."""
    private_dir(root(), "checkpoint staging")
    sweep_dead(folder.parent)
    folder.parent.mkdir(mode=0o700, exist_ok=True)  # writable by this user alone, as remove_inside requires
    folder.mkdir(mode=0o700)
    write_owner(folder)


def write_owner(folder: Path) -> None:
    owner = {"host": lease.this_host(), "boot": lease.boot_id(), "pid": os.getpid()}
    (folder / STAGING_OWNER).write_text(json.dumps(owner))


def owner(folder: Path) -> dict | None:
    """A staging folder's owner record (None: none, e.g. a folder of an earlier release, or unreadable)."""
    try:
        record = json.loads((folder / STAGING_OWNER).read_text())
    except (OSError, ValueError):
        return None
    return record if isinstance(record, dict) else None


def sweep_dead(store_root: Path, top: Path | None = None) -> None:
    """Remove the staging folders under ``store_root`` (inside ``top``, default ``root()``) whose owner was a
    process of this host that is gone."""
    top = root() if top is None else top
    for folder in store_root.glob("*/"):
        record = owner(folder)  # None: being created, or not ours to judge
        if record is not None and lease.dead_here(record):
            try:
                remove_inside(top, folder.relative_to(top), prune=False)
            except OSError:
                pass  # removed meanwhile, or not ours to remove


def remove_job_folder(path: Path, top: Path | None = None) -> None:
    """Delete a job's staging folder and the parents it leaves empty below the staging root ``top``
    (default ``root()``; one folder per store otherwise piles up), through folder descriptors
    (``common.private.remove_inside``); nothing if the root is not this user's alone."""
    top = root() if top is None else top
    try:
        remove_inside(top, path.relative_to(top))
    except OSError:
        pass  # already removed, or not ours to remove
