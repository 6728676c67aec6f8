"""The run's newest committed checkpoints kept on this node's disk, so that a restart here resumes without
downloading them (``train.keep_local_checkpoints``; 0 = none).

After a save commits, the folder it was uploaded from is not deleted but moved (one rename) to
``<staging root>/<store hash>/kept-<run id>/<step>/``, with the digests it was committed with; older copies
of the run beyond the newest ``keep`` are removed. A resume uses a copy only if

- the node ran every rank of the job (one node: its folder holds every rank's files; on several nodes each
  holds its own ranks' only, and a restart may land elsewhere: they download, as before),
- the store's checkpoint is committed and its ``digests.json`` lists the same files and digests, and
- every file of the copy hashes to its digest, and no file is missing or added (``checkpoint.verify``);

otherwise the copy is removed and the checkpoint downloaded. Between the store's checkpoints a run may also save
checkpoints kept here only (``train.local_checkpoint_every``; never uploaded): a restart on this node resumes from
the newest copy newer than the store's newest checkpoint once its files hash to its own digests (``newer_copy``),
going back fewer steps. A run that finishes removes its copies
(``discard``): nothing restarts it. The copies live in the user's private staging
root (``runs.staging``: 0700, checked each time); they have no owner record, so the start-up sweep of dead
jobs' folders leaves them, and ``pretrain gc`` removes one a day after it was written.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Callable
from pathlib import Path

from common.contracts import CHECKPOINT_DIGESTS
from common.private import private_dir, remove_inside
from runs.staging import KEPT_PREFIX, root, store_root
from storage import Store


def single_node() -> bool:
    """Whether this job's ranks all run on this node (then its staging folder holds every rank's files)."""
    return os.environ.get("LOCAL_WORLD_SIZE", "1") == os.environ.get("WORLD_SIZE", "1")


def run_folder(store_uri: str, run_prefix: str) -> Path:
    """Where the local copies of the run under ``run_prefix`` (``runs/<id>``) are kept."""
    run = run_prefix.rstrip("/").rsplit("/", 1)[-1]
    if not re.fullmatch(r"[0-9A-Za-z_.-]+", run):
        raise ValueError(f"not a run id: {run!r}")
    return store_root(store_uri) / f"{KEPT_PREFIX}{run}"


def copy_folder(store_uri: str, run_prefix: str, step: int) -> Path:
    return run_folder(store_uri, run_prefix) / f"{step:09d}"


def keep(store_uri: str, run_prefix: str, step: int, saved: Path, digests: dict[str, str], fmt: str, newest: int) -> None:
    """Keep ``saved`` (the folder the checkpoint of ``step`` was uploaded from, now committed) as the run's local
    copy, with its digests; remove the run's copies older than the newest ``newest``. Called by the node's
    only leader (single node), after the commit; nothing is kept when ``newest`` is 0."""
    if newest < 1:
        return
    private_dir(root(), "checkpoint staging")
    folder = copy_folder(store_uri, run_prefix, step)
    folder.parent.mkdir(mode=0o700, exist_ok=True)
    (saved / CHECKPOINT_DIGESTS).write_text(json.dumps({"format": fmt, "files": digests}))
    if folder.exists():
        _remove(folder)
    saved.rename(folder)
    for old in sorted(p for p in folder.parent.iterdir() if p.is_dir())[:-newest]:
        _remove(old)


def discard(store_uri: str, run_prefix: str) -> None:
    """Remove every copy this node keeps of the run (it finished: nothing restarts it)."""
    folder = run_folder(store_uri, run_prefix)
    if folder.is_dir() and not folder.is_symlink():
        _remove(folder)


def newer_copy(store_uri: str, run_prefix: str, step: int, verify: Callable[[Path, str], None]) -> tuple[int, Path] | None:
    """The newest copy this node keeps of the run that is newer than step ``step`` (the store's newest committed
    checkpoint; such a copy was saved here only) and whose files are those its digests list, with its step; None
    when there is none (or not on one node). A copy that fails the check is removed and the next one tried."""
    if not single_node():
        return None
    folder = run_folder(store_uri, run_prefix)
    if not folder.is_dir() or folder.is_symlink():
        return None
    newer = sorted((int(p.name), p) for p in folder.iterdir() if p.name.isdigit() and int(p.name) > step)
    for saved_step, copy in reversed(newer):
        if copy.is_symlink() or not copy.is_dir():
            continue
        try:
            verify(copy, str(copy))
        except (OSError, ValueError) as e:
            print(f"this node's checkpoint {copy} not used ({type(e).__name__}: {e})", flush=True)
            _remove(copy)
            continue
        return saved_step, copy
    return None


def usable(store: Store, prefix: str, step: int, run_prefix: str, verify: Callable[[Path, str], None]) -> Path | None:
    """The local copy of the committed checkpoint ``prefix`` (of step ``step``) if this node has one whose files
    are the committed ones (see the module; ``verify`` is ``checkpoint.verify``, which raises a ValueError for a
    folder whose files are not those its digests list); None otherwise (a copy that is not is removed)."""
    if not single_node():
        return None
    folder = copy_folder(store.uri, run_prefix, step)
    if not folder.is_dir() or folder.is_symlink():
        return None
    try:
        if not store.is_committed(prefix):
            return None
        committed = json.loads(store.get_bytes(f"{prefix}/{CHECKPOINT_DIGESTS}", "record"))
        local = json.loads((folder / CHECKPOINT_DIGESTS).read_bytes())
        if committed != local:
            raise ValueError(f"its digests are not those of the committed {store.url(prefix)}")
        verify(folder, str(folder))
    except (OSError, ValueError) as e:
        print(f"local copy {folder} not used ({type(e).__name__}: {e}); downloading {store.url(prefix)}", flush=True)
        _remove(folder)
        return None
    return folder


def _remove(folder: Path) -> None:
    try:
        remove_inside(root(), folder.relative_to(root()), prune=False)
    except OSError:
        pass  # removed meanwhile, or not ours to remove
