"""Retention: what ``pretrain gc`` removes from a store, what it keeps, and why (docs/retention.md).

Removed (``plan`` lists them, ``apply`` deletes them):

- leftovers that never committed: checkpoint folders under ``runs/<id>/checkpoints/``, datasets
  (``datasets/<v>/``), validation outputs (``datasets/<v>/validation/``), evaluation outputs
  (``runs/<id>/eval/<key>/``), registry versions claimed and never committed (``models/<name>/<v>/``),
  and a local store's temporary files of interrupted writes (``.tmp-*``);
- committed checkpoints beyond the run's own ``train.keep_checkpoints`` (its latest checkpoint's
  ``meta.json``: the setting is part of the run id, so every session of a run has the same);
- local checkpoint staging folders (``$TMPDIR/pretrain-staging/``) of processes that are gone.

Never touched: committed registry versions and aliases; the latest committed checkpoint of every
run (it may still resume); a checkpoint a registered version's card names (its lineage; the
registry holds its own copy, but the URL on the card and Flyte's cached train/evaluate outputs keep
pointing at it); anything written in the last ``min_age_s`` (a live writer's upload in flight looks
exactly like a leftover); any uncommitted checkpoint of a run whose lease (``runs/<id>/lease.json``,
``runs.lease``) is live; and whatever it cannot classify ("unknown, kept").

``apply`` checks each entry again just before deleting it (still uncommitted and old, still beyond
keep and not the latest, the run's lease still not live) and deletes with ``Store.delete_prefix``,
which removes the commit marker first: a half-deleted folder never looks complete.

Torch-free and Flyte-free: the CLI imports it.
"""

from __future__ import annotations

import os
import stat
import time
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from common.contracts import (
    CHECKPOINT_META,
    DATASETS,
    DIAGNOSTICS,
    GOODPUT,
    HEALTH,
    METRICS,
    MODELS,
    RUN_LEASE,
    RUN_LEASE_SEQUENCE,
    RUNS,
    STEP_TIMES,
    TENSORBOARD,
    card_key,
    checkpoint_prefix,
    committed_steps,
    lease_key,
    prunable,
    step_of_checkpoint,
)
from common.errors import first_line
from common.names import VERSION
from common.private import not_yours_alone, remove_inside
from common.terminal import escaped
from runs import staging as checkpoint_staging
from runs.lease import STALE_S, dead_here
from runs.staging import KEPT_PREFIX
from storage import COMMIT_MARKER, Store, StoreError
from storage.store import LOCK_NAME, ObjectInfo, key_problem

DEFAULT_MIN_AGE_S = 3600.0
"""Nothing written more recently than this is touched: longer than any writer takes between its
last object and its commit (a checkpoint's upload, a registration's copy)."""
LEASE_GRACE_S = 10 * STALE_S
"""A run's lease counts as live unless its holder is certainly dead or neither its heartbeat nor its
last write is this recent: generous beyond ``runs.lease``'s own stale limit (clocks, pauses)."""
STAGING_MAX_AGE_S = 24 * 3600.0
"""A staging folder whose owner cannot be told (no record, another host, a live pid) is removed only
once nothing in it changed for this long."""

CHECKPOINTS, EVAL, VALIDATION = "checkpoints", "eval", "validation"
ALIASES, REGISTRATIONS = "aliases", "registrations"
RUN_FILES = {METRICS, STEP_TIMES, HEALTH, RUN_LEASE, RUN_LEASE_SEQUENCE, TENSORBOARD, DIAGNOSTICS, GOODPUT}
"""What a run's folder holds besides its checkpoints and evaluations (``common.contracts``)."""
TEMPORARY = ".tmp-"
"""A local store's temporary files (``storage.store``): a write in flight or left by a killed writer."""
TEMPORARY_MIN_AGE_S = 600.0
"""A temporary file written this recently is kept whatever the age rule (even ``--min-age 0``): a live
writer's file in flight (a lease, a metrics rewrite, a checkpoint file) grows or is renamed within
seconds, and deleting it under the writer fails that write (a training run's lease, once in CI)."""

# What an entry is: the categories gc knows.
UNCOMMITTED_CHECKPOINT = "uncommitted checkpoint"
OLD_CHECKPOINT = "checkpoint beyond keep_checkpoints"
UNCOMMITTED_DATASET = "uncommitted dataset"
UNCOMMITTED_VALIDATION = "uncommitted validation outputs"
UNCOMMITTED_EVALUATION = "uncommitted evaluation outputs"
ABANDONED_CLAIM = "registry version claimed, never committed"
TEMPORARY_FILE = "temporary file of an interrupted write"
STAGING = "local checkpoint staging folder"
UNKNOWN = "unknown"


@dataclass
class Entry:
    """One thing gc looked at: a store folder (or a local path, ``local``) and its verdict."""

    where: str
    """The store key prefix (a folder, or one temporary file's key), or a local path."""
    what: str
    """Its category (the constants above)."""
    size: int
    """Bytes."""
    objects: int
    modified: float | None
    """Its newest write (seconds since the epoch)."""
    remove: bool
    reason: str
    """Why it goes, or why it stays."""
    local: bool = False
    file: bool = False
    """One object (a temporary file, a file where only folders belong), not a folder."""
    run: str = ""
    """The run it belongs to (``runs/<id>``), for the checks ``apply`` repeats."""
    step: int | None = None
    records: list[str] = field(default_factory=list)
    """Registry records naming an abandoned claim's version (``models/<name>/registrations/``), deleted
    before the folder: a rerun of that registration must claim afresh, not refill a number another
    registration may claim once the folder is gone."""


@dataclass
class Plan:
    """What ``gc`` would do to ``store`` at ``now``."""

    store: str
    now: float
    min_age_s: float
    entries: list[Entry] = field(default_factory=list)
    staging_root: str = ""
    """The local checkpoint staging root it looked in: every store's jobs on this host (``local`` entries)."""

    @property
    def removals(self) -> list[Entry]:
        return [e for e in self.entries if e.remove]

    @property
    def kept(self) -> list[Entry]:
        return [e for e in self.entries if not e.remove]

    @property
    def total_bytes(self) -> int:
        return sum(e.size for e in self.removals)

    def to_dict(self) -> dict[str, Any]:
        return {
            "store": self.store,
            "now": self.now,
            "min_age_s": self.min_age_s,
            "staging_root": self.staging_root,
            "total_bytes": self.total_bytes,
            "remove": [asdict(e) for e in self.removals],
            "kept": [asdict(e) for e in self.kept],
        }


@dataclass
class Outcome:
    """What ``apply`` did with each entry of a plan."""

    removed: list[Entry] = field(default_factory=list)
    skipped: list[tuple[Entry, str]] = field(default_factory=list)
    """Entries no longer eligible when looked at again (a writer came back), with why."""
    failed: list[tuple[Entry, str]] = field(default_factory=list)

    @property
    def removed_bytes(self) -> int:
        return sum(e.size for e in self.removed)


# -- a folder's objects ---------------------------------------------------------------------
@dataclass
class _Folder:
    prefix: str
    objects: list[ObjectInfo] = field(default_factory=list)

    @property
    def committed(self) -> bool:
        return any(o.key == f"{self.prefix}/{COMMIT_MARKER}" for o in self.objects)

    @property
    def size(self) -> int:
        return sum(o.size for o in self.objects)

    @property
    def newest(self) -> float | None:
        return max((o.modified for o in self.objects), default=None)

    def entry(self, what: str, remove: bool, reason: str, **kw: Any) -> Entry:
        return Entry(self.prefix, what, self.size, len(self.objects), self.newest, remove, reason, **kw)


def _is_temporary(key: str) -> bool:
    name = key.rsplit("/", 1)[-1]
    return name.startswith(TEMPORARY) and name != LOCK_NAME


def human_size(n: int) -> str:
    """``n`` bytes as B, KiB, MiB, GiB or TiB with one decimal."""
    size = float(n)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if size < 1024 or unit == "GiB":
            return f"{int(size)} B" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1024
    return f"{size:.1f} TiB"  # pragma: no cover - the loop returns


def _ago(now: float, when: float | None) -> str:
    if when is None:
        return "never written"
    seconds = max(0.0, now - when)
    if seconds < 120:
        return f"{seconds:.0f} s ago"
    if seconds < 2 * 3600:
        return f"{seconds / 60:.0f} min ago"
    if seconds < 2 * 86400:
        return f"{seconds / 3600:.1f} h ago"
    return f"{seconds / 86400:.1f} days ago"


# -- the plan -------------------------------------------------------------------------------
class _Planner:
    def __init__(self, store: Store, min_age_s: float, now: float) -> None:
        self.store, self.min_age_s, self.now = store, min_age_s, now
        self.entries: list[Entry] = []
        self._leases: dict[str, str] = {}

    def recent(self, folder: _Folder) -> bool:
        newest = folder.newest
        return newest is not None and self.now - newest < self.min_age_s

    def too_recent(self, folder: _Folder) -> str:
        return f"written {_ago(self.now, folder.newest)}, within the last {self.min_age_s / 60:g} min (a writer may be live)"

    def live_lease(self, run: str) -> str:
        """Why run ``run``'s lease says it is live ('' if it has none, or its holder is gone)."""
        if run not in self._leases:
            self._leases[run] = lease_holder(self.store, run, self.now)
        return self._leases[run]

    def leftover(self, folder: _Folder, what: str, **kw: Any) -> None:
        """An uncommitted folder: removed unless recent (or, for a checkpoint, its run is live)."""
        if self.recent(folder):
            self.entries.append(folder.entry(what, False, self.too_recent(folder), **kw))
            return
        live = self.live_lease(kw["run"]) if what == UNCOMMITTED_CHECKPOINT else ""
        if live:
            self.entries.append(folder.entry(what, False, f"its run is live ({live}): it may be uploading it", **kw))
            return
        self.entries.append(folder.entry(what, True, f"last written {_ago(self.now, folder.newest)}", **kw))

    def unknown(self, folder: _Folder, *, file: bool = False) -> None:
        self.entries.append(folder.entry(UNKNOWN, False, "unknown, kept", file=file))

    def temporaries(self, objects: Iterable[ObjectInfo]) -> None:
        """Temporary files outside any leftover folder: removed once old."""
        for o in objects:
            folder = _Folder(o.key, [o])
            if self.recent(folder):
                self.entries.append(folder.entry(TEMPORARY_FILE, False, self.too_recent(folder), file=True))
            elif self.now - o.modified < TEMPORARY_MIN_AGE_S:
                kept_min = TEMPORARY_MIN_AGE_S / 60
                reason = f"written {_ago(self.now, o.modified)}: a write in flight (temporary files are kept {kept_min:g} min)"
                self.entries.append(folder.entry(TEMPORARY_FILE, False, reason, file=True))
            else:
                self.entries.append(folder.entry(TEMPORARY_FILE, True, f"last written {_ago(self.now, o.modified)}", file=True))


def plan(
    store: Store, *, min_age_s: float = DEFAULT_MIN_AGE_S, now: float | None = None, staging_root: Path | None = None
) -> Plan:
    """What gc would remove from ``store`` and what it keeps, from one listing of the store (nothing is
    changed). ``staging_root``: where local checkpoint staging lives (default ``$TMPDIR/pretrain-staging``)."""
    listing = store.list_info("", temporary=True)
    now = time.time() if now is None else now  # after the listing: nothing listed is younger than 0 s
    planner = _Planner(store, min_age_s, now)
    by_top: dict[str, list[ObjectInfo]] = defaultdict(list)
    for o in listing:
        if o.key.rsplit("/", 1)[-1] == LOCK_NAME:
            continue  # a folder's lock file for compare-and-swap writes (aliases, leases): in use, or harmless
        problem = key_problem(o.key)
        if problem:  # e.g. `datasets//x` or a folder object `models/gpt/registrations/` (S3 keeps both)
            reason = f"a key outside the store's layout ({problem}): kept, and no part of any folder gc judges"
            planner.entries.append(_Folder(o.key, [o]).entry(UNKNOWN, False, reason, file=True))
            continue
        by_top[o.key.split("/", 1)[0] if "/" in o.key else ""].append(o)
    protected = _registered_checkpoints(store, by_top.get(MODELS, []), planner)
    for top, objects in sorted(by_top.items()):
        if top == DATASETS:
            _datasets(planner, objects)
        elif top == RUNS:
            _runs(planner, objects, protected)
        elif top == MODELS:
            _models(planner, objects)
        else:
            _unknown_tree(planner, objects, top)
    staging_root = staging_root if staging_root is not None else checkpoint_staging.root()
    _staging(planner, staging_root)
    return Plan(store=store.uri, now=now, min_age_s=min_age_s, entries=planner.entries, staging_root=str(staging_root))


def _group(objects: Iterable[ObjectInfo], depth: int) -> dict[str, list[ObjectInfo]]:
    """Objects by their folder ``depth`` parts deep (``''`` for those directly above that depth)."""
    groups: dict[str, list[ObjectInfo]] = defaultdict(list)
    for o in objects:
        parts = o.key.split("/")
        groups["/".join(parts[:depth]) if len(parts) > depth else ""].append(o)
    return groups


def _loose(planner: _Planner, objects: list[ObjectInfo]) -> None:
    """Files sitting where gc expects only folders: temporary files, or unknown (one entry each)."""
    planner.temporaries(o for o in objects if _is_temporary(o.key))
    for o in objects:
        if not _is_temporary(o.key):
            planner.unknown(_Folder(o.key, [o]), file=True)


def _unknown_tree(planner: _Planner, objects: list[ObjectInfo], top: str) -> None:
    if top:
        temps = [o for o in objects if _is_temporary(o.key)]
        planner.temporaries(temps)
        rest = [o for o in objects if not _is_temporary(o.key)]
        if rest:
            planner.unknown(_Folder(top, rest))
    else:
        _loose(planner, objects)


def _temporaries_inside(planner: _Planner, folder: _Folder) -> None:
    """Old temporary files inside a committed folder (a killed rewrite): not part of what it holds."""
    planner.temporaries(o for o in folder.objects if _is_temporary(o.key))


def _datasets(planner: _Planner, objects: list[ObjectInfo]) -> None:
    groups = _group(objects, 2)
    _loose(planner, groups.pop("", []))
    for prefix, members in sorted(groups.items()):
        dataset = _Folder(prefix, members)
        if not dataset.committed:
            planner.leftover(dataset, UNCOMMITTED_DATASET)
            continue
        validation = _Folder(f"{prefix}/{VALIDATION}", [o for o in members if o.key.startswith(f"{prefix}/{VALIDATION}/")])
        rest = members
        if validation.objects and not validation.committed:
            planner.leftover(validation, UNCOMMITTED_VALIDATION)  # its temporary files go with it
            rest = [o for o in members if not o.key.startswith(f"{prefix}/{VALIDATION}/")]
        _temporaries_inside(planner, _Folder(prefix, rest))


def _runs(planner: _Planner, objects: list[ObjectInfo], protected: dict[str, str]) -> None:
    groups = _group(objects, 2)
    _loose(planner, groups.pop("", []))
    for run, members in sorted(groups.items()):
        parts: dict[str, list[ObjectInfo]] = defaultdict(list)  # the run's files and folders, by name
        for o in members:
            parts["/".join(o.key.split("/")[:3])].append(o)
        for part, inside in sorted(parts.items()):
            name = part.rsplit("/", 1)[-1]
            if name == CHECKPOINTS:
                _checkpoints(planner, run, inside, protected)
            elif name == EVAL:
                _evaluations(planner, run, inside)
            elif name in RUN_FILES:
                planner.temporaries(o for o in inside if _is_temporary(o.key))
            elif _is_temporary(part):
                planner.temporaries(inside)  # a rewrite of metrics.jsonl and the like, interrupted
            else:
                planner.unknown(_Folder(part, inside), file=inside[0].key == part)


def _checkpoints(planner: _Planner, run: str, objects: list[ObjectInfo], protected: dict[str, str]) -> None:
    groups = _group(objects, 4)
    _loose(planner, groups.pop("", []))
    folders = {prefix: _Folder(prefix, members) for prefix, members in groups.items()}
    steps: dict[int, _Folder] = {}
    for prefix, folder in sorted(folders.items()):
        step = step_of_checkpoint(prefix.rsplit("/", 1)[-1])
        if step is None:
            planner.unknown(folder)
        elif not folder.committed:
            planner.leftover(folder, UNCOMMITTED_CHECKPOINT, run=run, step=step)
        else:
            steps[step] = folder
            _temporaries_inside(planner, folder)
    if not steps:
        return
    latest = max(steps)
    policy, why = run_keep(planner.store, run, latest)
    if policy is None:
        for step in sorted(steps)[:-1]:
            planner.entries.append(steps[step].entry(UNKNOWN, False, f"unknown, kept: {why}", run=run, step=step))
        return
    # Never the latest: keep <= 0 means keep all (as training prunes), and keep >= 1 leaves it out; nor a
    # multiple of keep_every (a WSD run's cooldown points).
    keep, every = policy
    for step in prunable(sorted(steps), keep, every):
        folder = steps[step]
        kw = {"run": run, "step": step}
        if folder.prefix in protected:
            planner.entries.append(folder.entry(OLD_CHECKPOINT, False, f"{protected[folder.prefix]}'s card names it", **kw))
        elif planner.recent(folder):
            planner.entries.append(folder.entry(OLD_CHECKPOINT, False, planner.too_recent(folder), **kw))
        else:
            reason = f"keep_checkpoints={keep}{f', keep_every={every}' if every else ''}; the run's latest is step {latest}"
            planner.entries.append(folder.entry(OLD_CHECKPOINT, True, reason, **kw))


def _evaluations(planner: _Planner, run: str, objects: list[ObjectInfo]) -> None:
    groups = _group(objects, 4)
    _loose(planner, groups.pop("", []))
    for prefix, members in sorted(groups.items()):
        folder = _Folder(prefix, members)
        if folder.committed:
            _temporaries_inside(planner, folder)
        else:
            planner.leftover(folder, UNCOMMITTED_EVALUATION, run=run)


def _models(planner: _Planner, objects: list[ObjectInfo]) -> None:
    groups = _group(objects, 2)
    _loose(planner, groups.pop("", []))
    for root, members in sorted(groups.items()):
        parts = _group(members, 3)
        _loose(planner, parts.pop("", []))
        for prefix, inside in sorted(parts.items()):
            name = prefix.rsplit("/", 1)[-1]
            folder = _Folder(prefix, inside)
            if name in (ALIASES, REGISTRATIONS):
                planner.temporaries(o for o in inside if _is_temporary(o.key))
            elif not VERSION.fullmatch(name):
                planner.unknown(folder)
            elif folder.committed:
                _temporaries_inside(planner, folder)  # a registered version: nothing else of it is touched
            else:
                records = _records_naming(planner.store, parts.get(f"{root}/{REGISTRATIONS}", []), int(name))
                # The records' age and size count too: a registration in progress writes its record first.
                planner.leftover(_Folder(prefix, inside + records), ABANDONED_CLAIM)
                planner.entries[-1].records = [o.key for o in records]


def _records_naming(store: Store, records: list[ObjectInfo], version: int) -> list[ObjectInfo]:
    """The registration records (``registry.registry``: ``{"version": N, ...}``) that name ``version``."""
    named = []
    for o in records:
        if _is_temporary(o.key):
            continue
        try:
            record = store.get_json(o.key)
        except (StoreError, ValueError):
            continue
        if isinstance(record, dict) and record.get("version") == version:
            named.append(o)
    return named


def _registered_checkpoints(store: Store, objects: list[ObjectInfo], planner: _Planner) -> dict[str, str]:
    """The checkpoint prefix each committed registry version's card names, and that version."""
    committed = {o.key.removesuffix(f"/{COMMIT_MARKER}") for o in objects if o.key.endswith(f"/{COMMIT_MARKER}")}
    named: dict[str, str] = {}
    for entry in sorted(committed):
        parts = entry.split("/")
        if len(parts) != 3 or not VERSION.fullmatch(parts[2]):
            continue
        try:
            lineage = store.get_json(card_key(entry))["lineage"]
            named[checkpoint_prefix(lineage["training_run"], int(lineage["training_steps"]))] = f"{parts[1]}:{parts[2]}"
        except (StoreError, ValueError, KeyError, TypeError) as e:
            # Which checkpoint it came from is unknown: every run's checkpoints stay as keep allows, and
            # the registry's own copy is complete; say so.
            folder = _Folder(entry, [o for o in objects if o.key.startswith(f"{entry}/")])
            planner.entries.append(folder.entry(UNKNOWN, False, f"unknown, kept: registered, card unreadable ({e})"))
    return named


def run_keep(store: Store, run: str, latest: int) -> tuple[tuple[int, int] | None, str]:
    """The run's ``train.keep_checkpoints`` and ``train.keep_every`` (from its latest committed checkpoint; a
    checkpoint from before keep_every: 0), or None and why not."""
    key = f"{checkpoint_prefix(run, latest)}/{CHECKPOINT_META}"
    try:
        train = store.get_json(key)["train"]
        keep, every = train["keep_checkpoints"], train.get("keep_every", 0)
    except (StoreError, ValueError, KeyError, TypeError, AttributeError) as e:
        return None, f"keep_checkpoints unreadable from {key} ({e})"
    for name, value in (("keep_checkpoints", keep), ("keep_every", every)):
        if type(value) is not int:
            return None, f"{name} in {key} is {value!r}, not a number"
    return (keep, every), ""


def lease_holder(store: Store, run: str, now: float) -> str:
    """Who holds run ``run``'s lease, if it may be live ('' when there is none or its holder is gone)."""
    key = lease_key(run)
    try:
        record = store.get_json(key)
    except StoreError:
        if not store.exists(key):
            return ""
        record = {}  # there but unreadable: judged by its age alone
    except ValueError:
        record = {}  # torn or foreign: judged by its age alone
    record = record if isinstance(record, dict) else {}
    if dead_here(record):
        return ""
    heartbeat = record.get("heartbeat")
    written = store.modified(key)
    recent = [t for t in (heartbeat, written) if isinstance(t, int | float) and now - t < LEASE_GRACE_S]
    if not recent:
        return ""
    return f"lease held by pid {record.get('pid', '?')} on host {record.get('host', '?')}, heartbeat {_ago(now, max(recent))}"


# -- local staging --------------------------------------------------------------------------
def _newest_local(path: Path) -> tuple[int, int, float | None]:
    """Bytes, files and newest modification under ``path`` (folders' own times included); what its owner
    removes during the walk is left out."""
    size, files, newest = 0, 0, None
    for folder, _dirs, names in os.walk(path):
        for name in [None, *names]:
            try:
                st = os.lstat(folder if name is None else os.path.join(folder, name))
            except FileNotFoundError:
                continue
            newest = st.st_mtime if newest is None else max(newest, st.st_mtime)
            if name is not None:
                size, files = size + st.st_size, files + 1
    return size, files, newest


def staging_folders(root: Path) -> list[Path]:
    """The staging folders under ``root``: ``<root>/<store hash>/<job>`` (earlier releases: ``<checkpoint key>``)."""
    found = []
    for store_dir in _subfolders(root):
        found += _subfolders(store_dir)
    return sorted(found)


def _subfolders(path: Path) -> list[Path]:
    """The real folders in ``path``: gc never follows a symbolic link out of the staging root (a link
    planted in the shared temporary folder once made it judge, and remove, another user's home)."""
    if path.is_symlink():
        return []
    try:
        return [p for p in path.iterdir() if not p.is_symlink() and p.is_dir()]
    except (FileNotFoundError, NotADirectoryError):
        return []  # none yet, or removed by its owner meanwhile


def _not_yours(root: Path) -> str:
    """Why gc must not walk the staging root ``root`` ('' if it may: absent, or a folder of this user's that
    nobody else can write, as training makes it)."""
    try:
        info = os.lstat(root)
    except FileNotFoundError:
        return ""
    if stat.S_ISLNK(info.st_mode) or not stat.S_ISDIR(info.st_mode):
        return "a link or not a folder"
    return not_yours_alone(info)


def _no_link_on_the_way(folder: Path) -> bool:
    """Whether the staging folder, its store folder and the staging root are real folders, not links
    (checked again just before a removal: one may have been swapped for a link since the plan)."""
    return not any(p.is_symlink() for p in (folder, folder.parent, folder.parent.parent))


def _staging_verdict(folder: Path, min_age_s: float, now: float) -> tuple[bool, str, tuple[int, int, float | None]]:
    stats = _newest_local(folder)
    newest = stats[2]
    owner = checkpoint_staging.owner(folder)
    if owner is not None and dead_here(owner):  # private to that process: nobody else writes there
        return True, f"its process {owner.get('pid')} on this host is gone; last written {_ago(now, newest)}", stats
    if newest is not None and now - newest < min_age_s:
        return False, f"written {_ago(now, newest)}, within the last {min_age_s / 60:g} min", stats
    if newest is not None and now - newest >= max(min_age_s, STAGING_MAX_AGE_S):
        return True, f"last written {_ago(now, newest)} (older than {STAGING_MAX_AGE_S / 3600:g} h)", stats
    if folder.name.startswith(KEPT_PREFIX):  # a run's local checkpoint copies (training/checkpointing/local_copy.py)
        run = folder.name.removeprefix(KEPT_PREFIX)
        return (
            False,
            f"run {run}'s newest checkpoints kept for a restart on this node; removed once {STAGING_MAX_AGE_S / 3600:g} h old",
            stats,
        )
    who = f"process {owner.get('pid')} on {owner.get('host')}" if owner else "an unknown process"
    return False, f"owned by {who}, which may be live; last written {_ago(now, newest)}", stats


def _staging(planner: _Planner, root: Path) -> None:
    problem = _not_yours(root)
    if problem:  # another user could swap a folder in it for a link to this user's home, after any check
        reason = f"{problem}: gc walks only a root of yours"
        planner.entries.append(Entry(str(root), STAGING, 0, 0, None, False, reason, local=True))
        return
    for folder in staging_folders(root):
        remove, reason, (size, files, newest) = _staging_verdict(folder, planner.min_age_s, planner.now)
        planner.entries.append(Entry(str(folder), STAGING, size, files, newest, remove, reason, local=True))


# -- applying it ----------------------------------------------------------------------------
def still_eligible(store: Store, entry: Entry, min_age_s: float, now: float | None = None) -> str:
    """Why ``entry`` must not be removed any more ('' if it still may): looked at again just before."""
    now = time.time() if now is None else now
    if entry.local:
        remove, reason, _ = _staging_verdict(Path(entry.where), min_age_s, now)
        return "" if remove else reason
    if entry.what == TEMPORARY_FILE:
        when = store.modified(entry.where)
        return "" if when is None or now - when >= max(min_age_s, TEMPORARY_MIN_AGE_S) else f"written {_ago(now, when)}"
    folder = _Folder(entry.where, store.list_info(entry.where, temporary=True))
    records = [when for when in map(store.modified, entry.records) if when is not None]
    newest = max([t for t in (folder.newest, *records) if t is not None], default=None)
    if newest is not None and now - newest < min_age_s:
        return f"written {_ago(now, newest)}, within the last {min_age_s / 60:g} min"
    if folder.newest is not None and now - folder.newest < min_age_s:
        return f"written {_ago(now, folder.newest)}, within the last {min_age_s / 60:g} min"
    if entry.what == OLD_CHECKPOINT:
        steps = committed_steps(store, entry.run)
        policy, why = run_keep(store, entry.run, steps[-1]) if steps else (None, "the run has no committed checkpoint")
        if policy is None or entry.step not in prunable(steps, *policy) or entry.step == steps[-1]:
            return why or f"no longer beyond keep_checkpoints (committed steps {steps})"
        return ""
    if folder.committed:
        return "committed since"
    if entry.what == UNCOMMITTED_CHECKPOINT:
        live = lease_holder(store, entry.run, now)
        if live:
            return f"its run is live ({live})"
    return ""


def apply(store: Store, plan_: Plan, *, now: float | None = None) -> Outcome:
    """Remove what ``plan_`` lists for removal, each entry checked again first (at ``now``, default the
    current time); a failure is recorded and the rest goes on."""
    outcome = Outcome()
    for entry in plan_.removals:
        try:
            why = still_eligible(store, entry, plan_.min_age_s, now)
            if why:
                outcome.skipped.append((entry, why))
                continue
            if entry.local:
                if not _no_link_on_the_way(Path(entry.where)):
                    outcome.skipped.append((entry, "a symbolic link on its path: gc never follows one"))
                    continue
                folder = Path(entry.where)
                top = folder.parent.parent  # <root>/<store>/<job>: removed through folder descriptors from the root
                remove_inside(top, folder.relative_to(top))
            else:
                for key in entry.records:
                    store.delete_prefix(key)  # one object: removed, so no rerun aims at this number again
                store.delete_prefix(entry.where)
            outcome.removed.append(entry)
        except (StoreError, OSError) as e:
            outcome.failed.append((entry, first_line(e)))
    return outcome


# -- in words -------------------------------------------------------------------------------
def _label(entry: Entry, plan_: Plan) -> str:
    if entry.local:
        return f"{entry.where}/ ({_whose(entry, plan_)})"
    return entry.where if entry.file else f"{entry.where}/"


def _whose(entry: Entry, plan_: Plan) -> str:
    """Which store a local staging folder ``<root>/<store hash>/<job>`` stages for: the plan's or another."""
    folder = Path(entry.where)
    if entry.where == plan_.staging_root:
        return "the staging root"
    return "this store's" if folder.parent.name == checkpoint_staging.store_root(plan_.store).name else "another store's"


def _line(entry: Entry, plan_: Plan, reason: str | None = None) -> str:
    what = "" if entry.what in (UNKNOWN, STAGING) else f"{entry.what}: "  # a staging folder is under its own heading
    records = f" (and {', '.join(entry.records)}, naming it)" if entry.records else ""
    return escaped(f"  {human_size(entry.size):>10}  {_label(entry, plan_)}{records}  {what}{reason or entry.reason}")


def report_lines(plan_: Plan, outcome: Outcome | None = None) -> list[str]:
    """``pretrain gc`` in words: what would go (or went), with sizes and a total, and what stays and why; the
    store's entries under the store's age rule, then this host's staging folders (every store's) under theirs."""
    age = f"nothing written in the last {plan_.min_age_s / 60:g} min is touched"
    if outcome is None:
        out = [f"store {plan_.store}: dry run, nothing removed (--apply removes what is listed); {age}"]
    else:
        out = [f"store {plan_.store}: {age}"]
    out += _section_lines(plan_, outcome, local=False)
    if any(e.local for e in plan_.entries):
        out.append(escaped(_staging_heading(plan_)))
        out += _section_lines(plan_, outcome, local=True)
    return out


def _staging_heading(plan_: Plan) -> str:
    """The rule of local staging folders (``_staging_verdict``), which is not the store's age rule."""
    kept_h = max(plan_.min_age_s, STAGING_MAX_AGE_S) / 3600
    return (
        f"local checkpoint staging in {plan_.staging_root} (this host's jobs, for any store, not only this one): a job's "
        f"folder goes once its process is gone, whatever its age, or once unchanged for {kept_h:g} h; kept otherwise"
    )


def _section_lines(plan_: Plan, outcome: Outcome | None, *, local: bool) -> list[str]:
    """What would go (or went) and what stays, of the store's entries or of the local ones."""
    entries = sorted((e for e in plan_.entries if e.local == local), key=lambda e: e.where)
    out = []
    if outcome is None:
        removals = [e for e in entries if e.remove]
        total = sum(e.size for e in removals)
        out.append(f"would remove {len(removals)}, {human_size(total)}:" if removals else "nothing to remove")
        out += [_line(e, plan_) for e in removals]
        if removals:
            out.append(f"  {human_size(total):>10}  total")
    else:
        removed = sorted((e for e in outcome.removed if e.local == local), key=lambda e: e.where)
        total = sum(e.size for e in removed)
        out.append(f"removed {len(removed)}, {human_size(total)}:" if removed else "removed nothing")
        out += [_line(e, plan_) for e in removed]
        if removed:
            out.append(f"  {human_size(total):>10}  total")
        skipped = [(e, why) for e, why in outcome.skipped if e.local == local]
        if skipped:
            out.append(f"left in place after a second look {len(skipped)}:")
            out += [_line(e, plan_, why) for e, why in skipped]
        failed = [(e, why) for e, why in outcome.failed if e.local == local]
        if failed:
            out.append(f"could not remove {len(failed)}:")
            out += [_line(e, plan_, why) for e, why in failed]
    kept = [e for e in entries if not e.remove]
    if kept:
        out.append(f"kept {len(kept)}:")
        out += [_line(e, plan_) for e in kept]
    return out
