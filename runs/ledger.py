"""A run's goodput ledger: where its wall time went, across every attempt and resume.

Each training attempt (one ``Trainer`` call; rank 0 writes) keeps one file in the run's store folder,
``runs/<id>/goodput/attempt-<started_at>-<uuid8>.json`` (``AttemptLedger``), with:

- ``started_at``: the rank process's creation time (seconds since the epoch), ``updated_at``: the last moment
  the file accounts for;
- ``parts``: the attempt's seconds in ``ATTEMPT_PARTS``, attributed one interval after the other, so that they
  sum to ``updated_at - started_at`` by construction: ``startup`` (process start to the first step's start:
  imports, process groups, loaders, model, the lease and the resume), per step (from its start to the next
  one's) ``data_wait`` (the step timer's data phase), ``checkpoint_stall`` (its checkpoint phase: what the step
  loop waited for, plus the run's files published after a save), ``evaluation`` (the validation loss) and
  ``productive`` (the rest), then ``shutdown`` (after the last step to the attempt's end: the callbacks' close,
  the final checkpoint's wait, the run's files, the lease);
- ``resumed_step`` (the checkpoint it started after), ``last_step`` (the last step it finished) and
  ``productive_at_step``: its cumulative productive seconds at each step it saved.

It is rewritten at most every ``HEARTBEAT_S`` during the steps, at every save and at the attempt's end (a
failure too, where the process lives to see it). ``load_goodput`` combines the attempts in start order into
one ``Goodput``: for every attempt after the first, the time from the previous attempt's last update to its
own first step is ``restarts`` (failure to resumed step), and the previous attempt's productive seconds after
the step this one resumed from (steps that were trained again) move from ``productive`` to ``retrained``.
Torch-free: ``pretrain runs`` reads it.
"""

from __future__ import annotations

import json
import math
import os
import sys
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from common.contracts import GOODPUT
from storage import Store

ATTEMPT_FORMAT = 1
HEARTBEAT_S = 5.0
"""An attempt's file is rewritten at most this often during the steps (and at every save and at its end). A
SIGKILL loses what came after the last write: up to this long of steps count as ``restarts``, not ``retrained``
(one small PUT by rank 0 per 5 s: a few ms on the step loop)."""

PARTS = ("startup", "productive", "data_wait", "checkpoint_stall", "evaluation", "shutdown", "restarts", "retrained")
"""What a run's wall time is split into (``Goodput.parts``)."""
ATTEMPT_PARTS = ("startup", "productive", "data_wait", "checkpoint_stall", "evaluation", "shutdown")
"""What one attempt's own time is split into (its file's ``parts``)."""


def goodput_prefix(run: str) -> str:
    """The folder of the attempt files of the run under key prefix ``run`` (``runs/<id>``)."""
    return f"{run}/{GOODPUT}"


def attempt_key(run: str, started_at: float) -> str:
    """A new attempt's file: named by its start (UTC, to the microsecond: names sort as starts do) and a random tag."""
    whole = math.floor(started_at)
    micros = min(999_999, round((started_at - whole) * 1e6))
    stamp = time.strftime("%Y%m%dT%H%M%S", time.gmtime(whole)) + f".{micros:06d}Z"
    return f"{goodput_prefix(run)}/attempt-{stamp}-{uuid.uuid4().hex[:8]}.json"


def process_started_at() -> float:
    """When this process was created, in seconds since the epoch: from ``/proc`` (its start in clock ticks since
    boot, against the uptime now: to 10 ms), else psutil, else now (the attempt then starts when this is called)."""
    try:
        with open("/proc/self/stat") as f:
            fields = f.read().rpartition(")")[2].split()  # after the command name, which may hold spaces
        with open("/proc/uptime") as f:
            uptime = float(f.read().split()[0])
        now = time.time()
        return now - (uptime - int(fields[19]) / os.sysconf("SC_CLK_TCK"))
    except (OSError, ValueError, IndexError):
        pass
    try:
        import psutil

        return float(psutil.Process().create_time())
    except Exception:  # noqa: BLE001 - no psutil, or no process information: now is the best left
        return time.time()


class AttemptLedger:
    """One training attempt's record (rank 0): the seconds of each part, attributed interval by interval.

    The caller marks the edges (``begin_steps``, ``step_done``, ``saved``, ``begin_shutdown``, ``end``) with
    the clock's time; each edge attributes the time since the previous one (the ``cursor``), so that the
    parts always sum to ``cursor - started_at``. Writes are best-effort: a store that fails a write gets one
    WARNING line, never the training's failure.
    """

    def __init__(
        self,
        store: Store,
        run: str,
        started_at: float | None = None,
        clock: Callable[[], float] = time.time,
        heartbeat_s: float = HEARTBEAT_S,
    ) -> None:
        self.store, self.run, self.clock, self.heartbeat_s = store, run, clock, heartbeat_s
        self.started_at = process_started_at() if started_at is None else started_at
        self.key = attempt_key(run, self.started_at)
        self.parts = dict.fromkeys(ATTEMPT_PARTS, 0.0)
        self.cursor = self.started_at
        """The time up to which the parts account."""
        self.stage = "startup"
        """Where the time since the cursor goes if the attempt ends now: startup, productive (mid-steps), shutdown."""
        self.resumed_step: int | None = None
        self.last_step: int | None = None
        self.productive_at_step: dict[int, float] = {}
        self.ended = False
        self._written_at = -math.inf
        self._warned = False

    # -- the edges --------------------------------------------------------------------------------
    def resumed(self, step: int) -> None:
        """The attempt continues after step ``step`` (0: from the start)."""
        self.resumed_step = step

    def begin_steps(self, now: float) -> None:
        """The first step starts: start-up ends."""
        self._attribute("startup", now)
        self.stage = "productive"
        self.write()

    def step_done(self, step: int, now: float, data_s: float = 0.0, checkpoint_s: float = 0.0, evaluation_s: float = 0.0) -> None:
        """Step ``step`` is over (its final record): the time since the previous edge is this step's, split into
        its data wait, checkpoint stall and evaluation as measured, and productive time (the rest)."""
        interval = max(0.0, now - self.cursor)
        measured = {"data_wait": data_s, "checkpoint_stall": checkpoint_s, "evaluation": evaluation_s}
        measured = {part: max(0.0, seconds) for part, seconds in measured.items()}
        for part, seconds in measured.items():
            self.parts[part] += seconds
        self.parts["productive"] += max(0.0, interval - sum(measured.values()))
        self.cursor = max(self.cursor, now)
        self.last_step = step
        if now - self._written_at >= self.heartbeat_s:
            self.write()

    def saved(self, step: int, now: float) -> None:
        """A checkpoint of ``step`` was committed and the run's files published: that time since the step's end
        is checkpoint stall; the productive seconds so far are those of steps up to ``step``."""
        self._attribute("checkpoint_stall", now)
        self.productive_at_step[step] = self.parts["productive"]
        self.write()

    def begin_shutdown(self, now: float) -> None:
        """The last step is done (or none was left to train: start-up ends here)."""
        self._attribute("startup" if self.stage == "startup" else "shutdown", now)
        self.stage = "shutdown"

    def end(self, now: float | None = None) -> None:
        """The attempt ends, well or not: the time since the last edge goes to where it was (start-up,
        productive for a step cut short, shutdown), and the file is written. Never raises; once only."""
        if self.ended:
            return
        try:
            self._attribute(self.stage, self.clock() if now is None else now)
            self.ended = True
            self.write()
        except Exception as e:  # noqa: BLE001 - however the attempt ends, the ledger never adds an error
            self._warn(e)

    def _attribute(self, part: str, now: float) -> None:
        self.parts[part] += max(0.0, now - self.cursor)
        self.cursor = max(self.cursor, now)

    # -- the file -------------------------------------------------------------------------------------
    def record(self) -> dict[str, Any]:
        return {
            "format": ATTEMPT_FORMAT,
            "started_at": self.started_at,
            "updated_at": self.cursor,
            "resumed_step": self.resumed_step,
            "last_step": self.last_step,
            "ended": self.ended,
            "parts": dict(self.parts),
            "productive_at_step": {str(step): s for step, s in sorted(self.productive_at_step.items())},
            "pid": os.getpid(),
        }

    def write(self) -> None:
        """The attempt's file as it stands (an atomic write; best-effort)."""
        self._written_at = self.cursor
        try:
            self.store.put_json(self.key, self.record())
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
    """The first attempt's start to the last attempt's last update (measured on its own, not the parts' sum)."""
    parts: dict[str, float]
    """Seconds per ``PARTS`` name."""
    attempts: int

    @property
    def fraction(self) -> float | None:
        """Productive seconds over the wall time (None for an empty one)."""
        return self.parts["productive"] / self.wall_s if self.wall_s > 0 else None

    @property
    def unaccounted_s(self) -> float:
        """The wall time less the parts (0 up to rounding; negative where attempts overlapped past a start-up)."""
        return self.wall_s - sum(self.parts.values())

    def to_dict(self) -> dict[str, Any]:
        return {
            "fraction": self.fraction,
            "wall_s": self.wall_s,
            "attempts": self.attempts,
            "parts": dict(self.parts),
            "unaccounted_s": self.unaccounted_s,
        }


SLACK_S = 60.0
"""How far a record's parts may sum past its span (the measured data, checkpoint and evaluation seconds)."""


def read_attempts(store: Store, run: str) -> list[dict[str, Any]]:
    """The run's attempt records in start order; a file that is not one (unreadable, planted) is left out."""
    attempts = []
    for key in store.list(f"{goodput_prefix(run)}/"):
        if not key.endswith(".json"):
            continue
        try:
            record = json.loads(store.get_bytes(key, "record"))
            attempts.append(_attempt(record))
        except (ValueError, TypeError, KeyError, AttributeError):
            continue
    return sorted(attempts, key=lambda a: (a["started_at"], a["updated_at"]))


def _attempt(record: dict[str, Any]) -> dict[str, Any]:
    """An attempt record checked and normalised (numbers as floats, step keys as ints); ValueError if it is not one."""
    started, updated = float(record["started_at"]), float(record["updated_at"])
    if not (math.isfinite(started) and math.isfinite(updated)) or updated < started:
        raise ValueError("not an attempt's times")
    parts = {part: float(record["parts"].get(part, 0.0)) for part in ATTEMPT_PARTS}
    steps = {int(step): float(s) for step, s in (record.get("productive_at_step") or {}).items()}
    # The ledger attributes each interval once, measured parts of a step aside (they may pass the interval a
    # little): parts past the attempt's own span by more than SLACK_S, or not finite, are not an attempt's.
    if not all(math.isfinite(v) and v >= 0 for v in (*parts.values(), *steps.values())):
        raise ValueError("an attempt's seconds are finite and not negative")
    if sum(parts.values()) > updated - started + SLACK_S or any(v > parts["productive"] for v in steps.values()):
        raise ValueError("an attempt's parts lie within its span")
    resumed, last = record.get("resumed_step"), record.get("last_step")
    if any(step is not None and int(step) < 0 for step in (resumed, last, *steps)):
        raise ValueError("an attempt's steps are not negative")
    return {
        "started_at": started,
        "updated_at": updated,
        "resumed_step": int(resumed) if resumed is not None else None,
        "last_step": int(last) if last is not None else None,
        "parts": parts,
        "productive_at_step": steps,
    }


def _productive_up_to(attempt: dict[str, Any], step: int) -> float:
    """The attempt's productive seconds of the steps up to ``step``: at its last save at or before ``step`` (0
    when it saved none by then: everything it trained came after)."""
    saved = [s for s in attempt["productive_at_step"] if s <= step]
    return attempt["productive_at_step"][max(saved)] if saved else 0.0


def retrained_s(previous: dict[str, Any], resumed_step: int | None) -> float:
    """The productive seconds of ``previous`` that the next attempt, resuming after ``resumed_step``, trains
    again: those after that step (0 when the next one resumed at or past every step ``previous`` finished and
    saved, or when its resume step is unknown)."""
    if resumed_step is None:
        return 0.0
    return max(0.0, previous["parts"]["productive"] - _productive_up_to(previous, resumed_step))


def combine(attempts: list[dict[str, Any]]) -> Goodput | None:
    """One ``Goodput`` of attempt records (``read_attempts``' form), in start order; None for none."""
    if not attempts:
        return None
    attempts = sorted(attempts, key=lambda a: (a["started_at"], a["updated_at"]))
    parts = dict.fromkeys(PARTS, 0.0)
    ended = attempts[0]["started_at"]  # the latest update of the attempts so far
    for k, attempt in enumerate(attempts):
        own = attempt["parts"]
        for part in ("productive", "data_wait", "checkpoint_stall", "evaluation", "shutdown"):
            parts[part] += own[part]
        if k == 0:
            parts["startup"] += own["startup"]
        else:
            # Failure to resumed step: the gap since the previous attempt's last update, and this one's start-up.
            # An attempt that started before the previous one ended (it waited for the run's lease) counts its
            # start-up only from that end.
            gap = attempt["started_at"] - ended
            parts["restarts"] += max(0.0, gap) + max(0.0, own["startup"] - max(0.0, -gap))
            moved = min(parts["productive"], retrained_s(attempts[k - 1], attempt["resumed_step"]))
            parts["productive"] -= moved
            parts["retrained"] += moved
        ended = max(ended, attempt["updated_at"])
    return Goodput(wall_s=ended - attempts[0]["started_at"], parts=parts, attempts=len(attempts))


def load_goodput(store: Store, run_prefix: str) -> Goodput | None:
    """The goodput of the run under key prefix ``run_prefix`` (``runs/<id>``), from every attempt file it has;
    None when it has none (a run from before the ledger, or one whose first attempt never got that far)."""
    return combine(read_attempts(store, run_prefix))
