"""A run's goodput ledger: where its wall time went, across every attempt and resume.

Each training attempt (one ``Trainer`` call; rank 0 writes) keeps one file in the run's store folder,
``runs/<id>/goodput/attempt-<started_at>-<uuid8>.json`` (``AttemptLedger``), with:

- ``started_at``: the rank process's creation time (seconds since the epoch), ``updated_at``: the last moment
  the file accounts for, both by the ledger's clock (the wall clock at its construction, then the monotonic
  clock: a clock step during the attempt moves neither its parts nor its span);
- ``sequence`` and ``leased_at``: the number the run's lease handed this attempt (``runs.lease``: 1, 2, ... in
  the order the attempts took it) and when (None until the Trainer tells them, once the lease is taken);
- ``parts``: the attempt's seconds in ``ATTEMPT_PARTS``, attributed one interval after the other, so that they
  sum to ``updated_at - started_at`` by construction: ``startup`` (process start to the first step: imports,
  process groups, loaders, model, the wait for the lease), ``checkpoint_restore`` (from the lease to the end of
  the resume), per step (from its start to the next one's) ``data_wait`` (the step timer's data phase),
  ``checkpoint_save`` (its checkpoint phase: what the step loop waited for, plus the run's files published
  after a save), ``evaluation`` (the validation loss), ``compile`` (torch.compile's seconds during the step)
  and ``productive`` (the rest), then ``other`` (after the last step to the attempt's end: the callbacks'
  close, the final checkpoint's wait, the run's files, the lease);
- ``resumed_step`` (the checkpoint it started after), ``last_step`` (the last step it finished) and
  ``productive_at_step``: its cumulative productive seconds at each step it saved.

It is rewritten every ``HEARTBEAT_S`` during the steps (by a thread of its own), at the end of the resume, at every save and at
the attempt's end (a failure too, where the process lives to see it). ``load_goodput`` combines the attempts
in the order of their lease sequence (``combine``) into one ``Goodput`` over ``PARTS``: for every attempt after
the first, the time from the previous attempt's last update to its own start is ``infrastructure_recovery``,
and the productive seconds that earlier attempts spent on steps after the one this one resumed from (steps
trained again) move from ``productive`` to ``wasted_progress``. Runs written before the lease sequence (format
1: start order, ``checkpoint_stall`` and ``shutdown`` read as ``checkpoint_save`` and ``other``) still read.
Torch-free: ``pretrain runs`` reads it.
"""

from __future__ import annotations

import json
import math
import os
import socket
import sys
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from common.contracts import GOODPUT
from storage import Store

ATTEMPT_FORMAT = 2
"""2: the lease's ``sequence`` and ``leased_at``, and the parts' names of ``ATTEMPT_PARTS``; 1: neither."""
HEARTBEAT_S = 1.0
"""During the steps, an attempt's file is rewritten this often by a thread of its own (``start_heartbeat``; and
at every save and at its end, by the step loop). A SIGKILL loses what came after the last write: up to this
long of steps count as ``infrastructure_recovery``, not ``wasted_progress``, and a rank killed outright is
what restarts in place are for. Off the step loop: one small PUT a second costs the steps nothing."""

PARTS = (
    "productive",
    "startup",
    "compile",
    "checkpoint_restore",
    "checkpoint_save",
    "data_wait",
    "evaluation",
    "wasted_progress",
    "infrastructure_recovery",
    "other",
)
"""What a run's wall time is split into (``Goodput.parts``): the categories of Google's ml-goodput-measurement."""
ATTEMPT_PARTS = tuple(part for part in PARTS if part not in ("wasted_progress", "infrastructure_recovery"))
"""What one attempt's own time is split into (its file's ``parts``)."""
FORMAT_1_NAMES = {"checkpoint_save": "checkpoint_stall", "other": "shutdown"}
"""The parts a format-1 file names otherwise (its ``startup`` holds the resume, its ``productive`` compiling)."""
SKEW_WARN_S = 1.0
"""A clock skew up to this is not warned of: an attempt's last write follows its lease's release by a moment, in
which the next attempt may take the lease."""


def goodput_prefix(run: str) -> str:
    """The folder of the attempt files of the run under key prefix ``run`` (``runs/<id>``)."""
    return f"{run}/{GOODPUT}"


def attempt_key(run: str, started_at: float) -> str:
    """A new attempt's file: named by its start (UTC, to the microsecond) and a random tag."""
    whole = math.floor(started_at)
    micros = min(999_999, round((started_at - whole) * 1e6))
    stamp = time.strftime("%Y%m%dT%H%M%S", time.gmtime(whole)) + f".{micros:06d}Z"
    return f"{goodput_prefix(run)}/attempt-{stamp}-{uuid.uuid4().hex[:8]}.json"


def process_age_s() -> float:
    """How long ago this process was created, in seconds: from ``/proc`` (its start in clock ticks since boot,
    against the uptime now: to 10 ms), else psutil, else 0 (the attempt then starts when this is called)."""
    try:
        with open("/proc/self/stat") as f:
            fields = f.read().rpartition(")")[2].split()  # after the command name, which may hold spaces
        with open("/proc/uptime") as f:
            uptime = float(f.read().split()[0])
        return max(0.0, uptime - int(fields[19]) / os.sysconf("SC_CLK_TCK"))
    except (OSError, ValueError, IndexError):
        pass
    try:
        import psutil

        return max(0.0, time.time() - float(psutil.Process().create_time()))
    except Exception:  # noqa: BLE001 - no psutil, or no process information: now is the best left
        return 0.0


def anchored_clock() -> Callable[[], float]:
    """Seconds since the epoch that do not jump with the wall clock: the wall clock now, then the monotonic
    clock's seconds since (a step of the host's clock during an attempt distorts none of its intervals)."""
    wall, anchor = time.time(), time.monotonic()
    return lambda: wall + (time.monotonic() - anchor)


class AttemptLedger:
    """One training attempt's record (rank 0): the seconds of each part, attributed interval by interval.

    The caller marks the edges (``restore_begins``, ``leased``, ``restore_done``, ``begin_steps``,
    ``step_done``, ``saved``, ``begin_shutdown``, ``end``) with the clock's time; each edge attributes the time
    since the previous one (the ``cursor``), so that the parts always sum to ``cursor - started_at``. Writes
    are best-effort: a store that fails a write gets one WARNING line, never the training's failure.
    """

    def __init__(
        self,
        store: Store,
        run: str,
        started_at: float | None = None,
        clock: Callable[[], float] | None = None,
        heartbeat_s: float = HEARTBEAT_S,
    ) -> None:
        self.clock = anchored_clock() if clock is None else clock
        self.store, self.run, self.heartbeat_s = store, run, heartbeat_s
        self.started_at = self.clock() - process_age_s() if started_at is None else started_at
        self.key = attempt_key(run, self.started_at)
        self.parts = dict.fromkeys(ATTEMPT_PARTS, 0.0)
        self.cursor = self.started_at
        """The time up to which the parts account."""
        self.stage = "startup"
        """The part the time since the cursor goes to if the attempt ends now: startup, checkpoint_restore (after
        the lease, in the resume), productive (mid-steps), other (after the steps)."""
        self.sequence: int | None = None
        self.leased_at: float | None = None
        self.resumed_step: int | None = None
        self.last_step: int | None = None
        self.productive_at_step: dict[int, float] = {}
        self.ended = False
        self._written_at = -math.inf
        self._warned = False
        self._state = threading.Lock()  # the record as the step loop changes it, against the heartbeat's copy
        self._io = threading.Lock()  # one write at a time, each of the record as it is when its turn comes
        self._stop = threading.Event()
        self._beat: threading.Thread | None = None

    def start_heartbeat(self) -> None:
        """Rewrite the file every ``heartbeat_s`` from a thread of its own while it changed (until ``end``): the
        steps no longer write it themselves."""
        if self._beat is None:
            self._beat = threading.Thread(target=self._beating, name="goodput-heartbeat", daemon=True)
            self._beat.start()

    def _beating(self) -> None:
        while not self._stop.wait(self.heartbeat_s):
            if self.cursor > self._written_at:
                self.write()

    # -- the edges --------------------------------------------------------------------------------
    def restore_begins(self, now: float) -> None:
        """The lease and the resume begin: start-up so far (and the wait for the lease, once ``leased`` tells
        when it was taken; a resume that fails before is ``checkpoint_restore`` from here)."""
        self._attribute("startup", now)
        self.stage = "checkpoint_restore"

    def leased(self, sequence: int | None, now: float) -> None:
        """The run's lease was taken at ``now``, handing out ``sequence``: the resume's time from there on is
        ``checkpoint_restore``."""
        self._attribute("startup", now)
        self.sequence, self.leased_at = sequence, max(self.cursor, now)
        self.stage = "checkpoint_restore"

    def restore_done(self, now: float) -> None:
        """The resume is over (the whole of it ``checkpoint_restore`` when no lease was told): written."""
        self._attribute("checkpoint_restore", now)
        self.stage = "startup"
        self.write()

    def resumed(self, step: int) -> None:
        """The attempt continues after step ``step`` (0: from the start)."""
        self.resumed_step = step

    def begin_steps(self, now: float) -> None:
        """The first step starts: start-up ends."""
        self._attribute(self.stage, now)
        self.stage = "productive"
        self.write()

    def step_done(
        self,
        step: int,
        now: float,
        data_s: float = 0.0,
        checkpoint_s: float = 0.0,
        evaluation_s: float = 0.0,
        compile_s: float = 0.0,
    ) -> None:
        """Step ``step`` is over (its final record): the time since the previous edge is this step's, split into
        its data wait, checkpoint save and evaluation as measured, the compiling within the rest, and productive
        time (what is left)."""
        interval = max(0.0, now - self.cursor)
        measured = {"data_wait": data_s, "checkpoint_save": checkpoint_s, "evaluation": evaluation_s}
        measured = {part: max(0.0, seconds) for part, seconds in measured.items()}
        rest = max(0.0, interval - sum(measured.values()))
        measured["compile"] = min(rest, max(0.0, compile_s))  # a compile inside the validation is evaluation's
        with self._state:
            for part, seconds in measured.items():
                self.parts[part] += seconds
            self.parts["productive"] += rest - measured["compile"]
            self.cursor = max(self.cursor, now)
            self.last_step = step
        if self._beat is None and now - self._written_at >= self.heartbeat_s:
            self.write()

    def saved(self, step: int, now: float) -> None:
        """A checkpoint of ``step`` was committed and the run's files published: that time since the step's end
        is checkpoint save; the productive seconds so far are those of steps up to ``step``."""
        self._attribute("checkpoint_save", now)
        with self._state:
            self.productive_at_step[step] = self.parts["productive"]
        self.write()

    def begin_shutdown(self, now: float) -> None:
        """The last step is done (or none was left to train: start-up ends here)."""
        self._attribute("other" if self.stage == "productive" else self.stage, now)
        self.stage = "other"

    def end(self, now: float | None = None) -> None:
        """The attempt ends, well or not: the time since the last edge goes to where it was (start-up, the resume,
        productive for a step cut short, other), and the file is written. Never raises; once only."""
        if self.ended:
            return
        self._stop.set()
        if self._beat is not None:
            self._beat.join(timeout=30)
        try:
            self._attribute(self.stage, self.clock() if now is None else now)
            self.ended = True
            self.write()
        except Exception as e:  # noqa: BLE001 - however the attempt ends, the ledger never adds an error
            self._warn(e)

    def _attribute(self, part: str, now: float) -> None:
        with self._state:
            self.parts[part] += max(0.0, now - self.cursor)
            self.cursor = max(self.cursor, now)

    # -- the file -------------------------------------------------------------------------------------
    def record(self) -> dict[str, Any]:
        with self._state:
            return self._record()

    def _record(self) -> dict[str, Any]:
        return {
            "format": ATTEMPT_FORMAT,
            "started_at": self.started_at,
            "updated_at": self.cursor,
            "sequence": self.sequence,
            "leased_at": self.leased_at,
            "resumed_step": self.resumed_step,
            "last_step": self.last_step,
            "ended": self.ended,
            "parts": dict(self.parts),
            "productive_at_step": {str(step): s for step, s in sorted(self.productive_at_step.items())},
            "host": socket.gethostname(),
            "pid": os.getpid(),
        }

    def write(self) -> None:
        """The attempt's file as it stands (an atomic write; best-effort)."""
        with self._io:
            record = self.record()
            self._written_at = record["updated_at"]
            try:
                self.store.put_json(self.key, record)
            except Exception as e:  # noqa: BLE001 - a ledger write never fails the training
                self._warn(e)

    def _warn(self, error: Exception) -> None:
        if not self._warned:
            self._warned = True
            where = self.store.url(self.key)
            print(f"WARNING: goodput ledger {where} not written ({type(error).__name__}: {error})", file=sys.stderr, flush=True)


# -- reading and combining -----------------------------------------------------------------------
@dataclass(frozen=True)
class Goodput:
    """A run's wall time and what it went to, over all its attempts."""

    wall_s: float
    """The first attempt's start to the last attempt's last update (measured on its own, not the parts' sum),
    after the clock skew's moves."""
    parts: dict[str, float]
    """Seconds per ``PARTS`` name."""
    attempts: int
    """The attempt files read (those killed before the run's lease, which are not combined, included)."""
    skew_s: float = 0.0
    """Clock skew found between hosts: the sum of the negative gaps between an attempt's lease and the previous
    attempt's last update (impossible: the lease is exclusive), by which those attempts' times were moved later.
    Counted in no part; a later attempt's clock ahead cannot be told from a longer recovery."""
    warnings: tuple[str, ...] = ()
    """One line per attempt moved by more than ``SKEW_WARN_S`` of skew."""

    @property
    def fraction(self) -> float | None:
        """Productive seconds over the wall time, within [0, 1] (None for an empty one)."""
        if not self.wall_s > 0:
            return None
        return min(1.0, max(0.0, self.parts["productive"] / self.wall_s))

    @property
    def unaccounted_s(self) -> float:
        """The wall time less the parts (0 up to rounding; negative where format-1 attempts overlapped past a
        start-up)."""
        return self.wall_s - sum(self.parts.values())

    def to_dict(self) -> dict[str, Any]:
        return {
            "fraction": self.fraction,
            "wall_s": self.wall_s,
            "attempts": self.attempts,
            "parts": dict(self.parts),
            "unaccounted_s": self.unaccounted_s,
            "skew_s": self.skew_s,
            "warnings": list(self.warnings),
        }


SLACK_S = 60.0
"""How far a record's parts may sum past its span (the measured data, checkpoint and evaluation seconds)."""


def read_attempts(store: Store, run: str) -> list[dict[str, Any]]:
    """The run's attempt records in their order (``in_order``); a file that is not one (unreadable, planted) is
    left out."""
    attempts = []
    for key in store.list(f"{goodput_prefix(run)}/"):
        if not key.endswith(".json"):
            continue
        try:
            record = json.loads(store.get_bytes(key, "record"))
            attempts.append(_attempt(record))
        except (ValueError, TypeError, KeyError, AttributeError):
            continue
    return in_order(attempts)


def _attempt(record: dict[str, Any]) -> dict[str, Any]:
    """An attempt record checked and normalised (numbers as floats, step keys as ints, format 1's part names as
    today's); ValueError if it is not one."""
    started, updated = float(record["started_at"]), float(record["updated_at"])
    if not (math.isfinite(started) and math.isfinite(updated)) or updated < started:
        raise ValueError("not an attempt's times")
    names = FORMAT_1_NAMES if int(record.get("format", 1)) < 2 else {}
    parts = {part: float(record["parts"].get(names.get(part, part), 0.0)) for part in ATTEMPT_PARTS}
    steps = {int(step): float(s) for step, s in (record.get("productive_at_step") or {}).items()}
    # The ledger attributes each interval once, measured parts of a step aside (they may pass the interval a
    # little): parts past the attempt's own span by more than SLACK_S, or not finite, are not an attempt's.
    if not all(math.isfinite(v) and v >= 0 for v in (*parts.values(), *steps.values())):
        raise ValueError("an attempt's seconds are finite and not negative")
    if sum(parts.values()) > updated - started + SLACK_S or any(v > parts["productive"] for v in steps.values()):
        raise ValueError("an attempt's parts lie within its span")
    resumed, last, sequence = record.get("resumed_step"), record.get("last_step"), record.get("sequence")
    if any(step is not None and int(step) < 0 for step in (resumed, last, *steps)):
        raise ValueError("an attempt's steps are not negative")
    if sequence is not None and (type(sequence) is not int or sequence < 0):
        raise ValueError("an attempt's lease sequence is a count")
    leased = record.get("leased_at")
    if leased is not None and not math.isfinite(float(leased)):
        raise ValueError("an attempt's lease time is finite")
    return {
        "started_at": started,
        "updated_at": updated,
        "legacy": "sequence" not in record,
        "sequence": sequence,
        "leased_at": min(updated, max(started, float(leased))) if leased is not None else None,
        "host": str(record.get("host") or ""),
        "resumed_step": int(resumed) if resumed is not None else None,
        "last_step": int(last) if last is not None else None,
        "parts": parts,
        "productive_at_step": steps,
    }


def trained(attempt: dict[str, Any]) -> bool:
    """Whether the attempt trained (a step finished, or one cut short)."""
    return attempt["last_step"] is not None or attempt["parts"]["productive"] > 0


def in_order(attempts: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The attempts in the order they ran: format 1's (no sequence recorded: runs from before it) by their start,
    then the others by the sequence their lease handed out; one of those without a sequence (its lease's sequence
    could not be written, or it never got the lease) by its start among them. Not by the hosts' clocks alone:
    one host's clock behind another's would put its attempt before the one it followed."""

    def by_start(a: dict[str, Any]) -> tuple[float, float]:
        return a["started_at"], a["updated_at"]

    legacy = sorted((a for a in attempts if a["legacy"]), key=by_start)
    current = [a for a in attempts if not a["legacy"]]
    sequenced = sorted((a for a in current if a["sequence"] is not None), key=lambda a: (a["sequence"], *by_start(a)))
    loose = sorted((a for a in current if a["sequence"] is None), key=by_start)
    out: list[dict[str, Any]] = []
    for attempt in sequenced:
        while loose and by_start(loose[0]) < by_start(attempt):
            out.append(loose.pop(0))
        out.append(attempt)
    return legacy + out + loose


def combined(attempts: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The attempts that combine, in order: in a run whose attempts have lease sequences, one without that trained
    nothing (killed before it took the lease: the Trainer tells the ledger the lease as soon as it is taken)
    is left out, its time lying in the gap before the next attempt."""
    if any(a["sequence"] is not None for a in attempts):
        attempts = [a for a in attempts if a["legacy"] or a["sequence"] is not None or trained(a)]
    return in_order(attempts)


def _productive_up_to(attempt: dict[str, Any], step: int) -> float:
    """The attempt's productive seconds of the steps up to ``step``: at its last save at or before ``step`` (0
    when it saved none by then: everything it trained came after)."""
    saved = [s for s in attempt["productive_at_step"] if s <= step]
    return attempt["productive_at_step"][max(saved)] if saved else 0.0


def wasted_s(previous: dict[str, Any], resumed_step: int | None) -> float:
    """The productive seconds of ``previous`` that a later attempt, resuming after ``resumed_step``, trains
    again: those after that step (0 when it resumed at or past every step ``previous`` finished and saved, or
    when its resume step is unknown)."""
    if resumed_step is None:
        return 0.0
    return max(0.0, previous["parts"]["productive"] - _productive_up_to(previous, resumed_step))


def _wasted(earlier: list[dict[str, Any]], resumed_step: int | None, charged: dict[int, float]) -> float:
    """The productive seconds of the ``earlier`` attempts that an attempt resuming after ``resumed_step`` trains
    again, less what ``charged`` (seconds per attempt's index) already counted as wasted: from the most recent
    attempt that trained back to one that resumed at or before that step. An attempt that trained nothing (one
    killed while it started or resumed) is passed over: it hides nothing of the one before."""
    if resumed_step is None:
        return 0.0
    wasted = 0.0
    for k in range(len(earlier) - 1, -1, -1):
        attempt = earlier[k]
        if not trained(attempt):
            continue
        more = max(0.0, wasted_s(attempt, resumed_step) - charged.get(k, 0.0))
        charged[k] = charged.get(k, 0.0) + more
        wasted += more
        if attempt["resumed_step"] is not None and attempt["resumed_step"] <= resumed_step:
            break
    return wasted


def _skew_warning(k: int, attempt: dict[str, Any], skew_s: float) -> str:
    where = f" on host {attempt['host']}" if attempt["host"] else ""
    started = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(attempt["started_at"]))
    return (
        f"clock skew: attempt {k + 1} (lease sequence {attempt['sequence']}{where}, started {started} by its clock) "
        f"took the run's lease {skew_s:.1f} s before the previous attempt's last update: its host's clock is behind; "
        f"its times are moved {skew_s:.1f} s later, and that time is counted in no part"
    )


def combine(attempts: list[dict[str, Any]]) -> Goodput | None:
    """One ``Goodput`` of attempt records (``read_attempts``' form), in the order they ran; None for none.

    For each attempt in turn (``combined``): a lease taken before the previous attempt's last update is clock
    skew (the lease is exclusive), by which the attempt's times are moved later; then the time from the previous
    attempt's last update to its start is ``infrastructure_recovery`` (an attempt that started before it, waiting
    for the lease, counts its start-up only from there); its own parts count as they are, and the productive
    seconds of earlier attempts that it trains again (``_wasted``) move to ``wasted_progress``."""
    if not attempts:
        return None
    ordered = combined(attempts)
    parts = dict.fromkeys(PARTS, 0.0)
    first = ended = ordered[0]["started_at"]  # ended: the latest update of the attempts so far
    skew, warnings, charged = 0.0, [], {}
    for k, attempt in enumerate(ordered):
        leased = attempt["leased_at"]
        shift = max(0.0, ended - leased) if k and leased is not None and not attempt["legacy"] else 0.0
        skew += shift
        if shift > SKEW_WARN_S:
            warnings.append(_skew_warning(k, attempt, shift))
        start, own = attempt["started_at"] + shift, attempt["parts"]
        for part in ATTEMPT_PARTS:
            parts[part] += own[part] if part != "startup" else max(0.0, own[part] - max(0.0, ended - start))
        parts["infrastructure_recovery"] += max(0.0, start - ended)
        moved = min(parts["productive"], _wasted(ordered[:k], attempt["resumed_step"], charged))
        parts["productive"] -= moved
        parts["wasted_progress"] += moved
        ended = max(ended, attempt["updated_at"] + shift)
    return Goodput(ended - first, parts, len(attempts), skew, tuple(warnings))


def load_goodput(store: Store, run_prefix: str) -> Goodput | None:
    """The goodput of the run under key prefix ``run_prefix`` (``runs/<id>``), from every attempt file it has;
    None when it has none (a run from before the ledger, or one whose first attempt never got that far)."""
    return combine(read_attempts(store, run_prefix))
