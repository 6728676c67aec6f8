"""Which rank failed first, and what its own error was.

When one rank fails, its peers fail too: blocked in a collective with it, they get the backend's
"Connection closed by peer" as soon as its connections close. The launcher cannot tell these
apart: torch.distributed.elastic reports the rank whose *process* exited first (with the spawn
start method, only that one; the others are terminated), and its error files carry whole-second
timestamps. A peer that exits quickly thus hides the genuine failure behind its collective error.

So each rank records its own failure before anything else can happen, while its connections are
still open, hence before any peer can fail because of it:

- ``record_failure``: a ``Failure`` (time, rank, where, "ExcType: message", traceback, error file)
  goes to the job's c10d store with ``compare_set`` (first writer wins, across every node of the
  job), and the winner to a file in this node's attempt folder of the launcher
  (``<log dir>/attempt_N/first_failure.json``, first writer wins too), which the launcher reads;
- a rank whose own error is a collective failure reads the winner (``first_failure``) and names it
  (``training.observe.watchdog.explain``);
- the launcher turns torch's ``ChildFailedError`` into a ``JobFailed`` whose first line names the
  first failing rank, its error and where its traceback is (``job_failure``): ``training.launch``
  outside Flyte, ``tasks.elastic`` in a Flyte ``Elastic`` task.

A rank killed outright (SIGKILL, OOM killer, segfault) records nothing: then the launcher prefers a
rank's own error over a collective failure, and the peers' errors name the ranks that did not arrive
(``training.observe.diagnostics`` heartbeats).
"""

from __future__ import annotations

import json
import os
import socket
import tempfile
import time
import traceback
from dataclasses import asdict, dataclass
from pathlib import Path

from torch.distributed.elastic.multiprocessing.errors import ChildFailedError, ProcessFailure, get_error_handler

from common.errors import UserError
from training.observe.diagnostics import _store_client

FILE_NAME = "first_failure.json"
"""In the launcher's attempt folder (the parent of each rank's error-file folder): one per node."""

BACKEND_SIGNS = ("gloo", "nccl", "c10d", "processgroup")
"""Words of the backends' own errors (gloo, NCCL, the c10d layer under both)."""

# The types of a rank's error that mean "a collective with a peer failed", as the error files name them.
_COLLECTIVE_TYPES = ("PeerFailure", "DistError", "DistBackendError", "DistNetworkError", "DistStoreError")

_MAX_TEXT = 4000  # a failure's message and traceback in the store: enough to act on, not a flood


@dataclass(frozen=True)
class Failure:
    """One rank's own failure, as recorded when it happened."""

    time: float
    rank: int
    where: str
    """What the rank was doing: 'step 3 (data)', 'checkpoint save at step 5', 'starting'."""
    error: str
    """'ValueError: boom at step 3'."""
    traceback: str = ""
    error_file: str = ""
    """The rank's torch.distributed.elastic error file (its full traceback); '' outside a launcher, and
    for a rank that exits without one (its watchdog ends it with ``os._exit``)."""
    host: str = ""
    user_error: bool = False
    """Whether the rank's error was a ``common.errors.UserError`` (a full store, a bad loss, a setting or
    an input found on the rank): then the job's error is one too (``RankUserError``)."""
    log_mark: str = "training failed"
    """What the rank printed to the job's log just before its traceback or stacks: '[rank N] <log_mark>'."""

    def describe(self) -> str:
        """'rank 1 failed first, during step 3 (data): ValueError: boom at step 3'."""
        during = "while starting" if self.where == "starting" else f"during {self.where}"
        return f"rank {self.rank} failed first, {during}: {self.error}"

    def traceback_at(self) -> str:
        """Where this failure's traceback is, for a message: its error file where one was written, and
        the job's log (a rank ended by its watchdog writes no error file, only its stacks to the log)."""
        in_log = f"the job's log after '[rank {self.rank}] {self.log_mark}'"
        if self.error_file:
            return f"its traceback: {self.error_file} on {self.host}, and in {in_log}"
        return f"its traceback: {in_log} (rank {self.rank} ran on {self.host})"

    def to_json(self) -> str:
        return json.dumps(asdict(self))

    @classmethod
    def from_json(cls, text: str | bytes) -> Failure:
        return cls(**json.loads(text))


def error_text(error: BaseException) -> str:
    """'ExcType: message' (the message capped), as torch's error files and our records say it."""
    message = str(error).strip()
    return f"{type(error).__name__}: {message[:_MAX_TEXT]}" if message else type(error).__name__


def is_collective_failure(error: str) -> bool:
    """Whether a rank's error text ('ExcType: message') is a collective that failed because of a peer."""
    kind, _, message = error.partition(":")
    kind = kind.strip().rsplit(".", 1)[-1]
    return kind in _COLLECTIVE_TYPES or (kind == "RuntimeError" and any(s in message.lower() for s in BACKEND_SIGNS))


def _key() -> str:
    # The agent's store outlives the workers (elastic restarts): one record per attempt.
    return f"pretrain/first_failure/{os.environ.get('TORCHELASTIC_RESTART_COUNT', '0')}"


def _node_file() -> Path | None:
    error_file = os.environ.get("TORCHELASTIC_ERROR_FILE")
    return Path(error_file).parent.parent / FILE_NAME if error_file else None


def _write_once(path: Path, text: str) -> None:
    """``text`` at ``path`` unless a file is there already; a reader never sees a partial file."""
    fd, tmp = tempfile.mkstemp(prefix=f".{FILE_NAME}.", dir=path.parent)
    try:
        with os.fdopen(fd, "w") as f:
            f.write(text)
        os.link(tmp, path)  # atomic, and fails if another rank's record is there
    except FileExistsError:
        pass
    finally:
        os.unlink(tmp)


def record_failure(error: BaseException, rank: int, where: str, *, exits: bool = False, log_mark: str = "") -> Failure:
    """Record this rank's own failure if it is the job's first; returns the job's first failure.

    Call it first thing in the handler, before the process group is shut down: a peer can only fail
    because of this rank once its connections close, so the genuine first failure is recorded before
    any failure it causes. Never raises: a store or folder that is gone leaves the record out.

    ``exits``: the process ends right after (``os._exit``), so torch never writes its error file: it is
    written here (this error, no traceback), so that the launcher reports this error rather than "exit
    status 86" and finds the record next to it; the record points at the job's log, where the rank
    printed ``[rank N] <log_mark>`` and its stacks.
    """
    own = Failure(
        time=time.time(),
        rank=rank,
        where=where,
        error=error_text(error),
        traceback="".join(traceback.format_exception(error))[-_MAX_TEXT:],
        error_file="" if exits else os.environ.get("TORCHELASTIC_ERROR_FILE", ""),
        host=socket.gethostname(),
        user_error=isinstance(error, UserError),
        log_mark=log_mark or Failure.log_mark,
    )
    if exits:
        try:
            get_error_handler().record_exception(error)  # torch's format, at $TORCHELASTIC_ERROR_FILE if set
        except Exception:  # noqa: BLE001 - without it the launcher says "exit status 86"; the record still goes
            pass
    first = own
    try:
        client = _store_client()
        if client is not None:
            first = Failure.from_json(client.compare_set(_key(), "", own.to_json()))
    except Exception:  # noqa: BLE001 - no store to agree through: this rank's record is the best known
        pass
    node_file = _node_file()
    if node_file is not None:
        try:
            _write_once(node_file, first.to_json())
        except OSError:
            pass
    return first


def first_failure() -> Failure | None:
    """The job's first recorded failure (any node), or None: read by a rank whose collective failed."""
    try:
        client = _store_client()
        if client is None or not client.check([_key()]):
            return None
        return Failure.from_json(client.get(_key()))
    except Exception:  # noqa: BLE001 - no store: the heartbeats may still say who did not arrive
        return None


# -- the launcher's side ------------------------------------------------------------------------


def _message(failure: ProcessFailure) -> str:
    """A reported failure's 'ExcType: message', or what torch says of a process without an error file."""
    message = failure.message
    if isinstance(message, dict):
        return str(message.get("message", "<N/A>"))
    signal = failure.signal_name()
    return f"exit status {failure.exitcode}" + (f" ({signal})" if signal and signal != "<N/A>" else "") + f": {message}"


def recorded_failure(error: ChildFailedError) -> Failure | None:
    """The first failure the ranks of this node recorded (see ``record_failure``), or None."""
    for failure in error.failures.values():
        if not failure.error_file or failure.error_file == "<N/A>":
            continue
        path = Path(failure.error_file).parent.parent / FILE_NAME
        try:
            return Failure.from_json(path.read_text())
        except (OSError, ValueError, TypeError):
            continue
    return None


def _mtime(path: str) -> float:
    try:
        return os.path.getmtime(path)
    except OSError:
        return float("inf")


def reported_first(error: ChildFailedError) -> int:
    """Without a record: the reported rank to blame. A rank's own error before any collective failure,
    then the earliest (error files' whole-second timestamps, then their modification times)."""
    return min(
        error.failures,
        key=lambda r: (
            is_collective_failure(_message(error.failures[r])),
            error.failures[r].timestamp,
            _mtime(error.failures[r].error_file),
            r,
        ),
    )


def job_failure(error: ChildFailedError) -> JobFailed:
    """``error`` as one error that names the first failing rank, its own error and its traceback.

    Where that rank's error was a UserError, a ``RankUserError`` whose cause is the ``JobFailed`` (the
    whole report, for a traceback log); raise it ``from`` its ``__cause__``, which is None otherwise."""
    failed = JobFailed(error.name, error.failures, recorded_failure(error))
    if failed.first is None or not failed.first.user_error:
        return failed
    user = RankUserError(error.name, error.failures, failed.first)
    user.__cause__ = failed
    return user


class JobFailed(ChildFailedError):
    """torch's ``ChildFailedError`` whose first line names the rank that failed first and its own error
    (its record, else the reported failures judged by ``reported_first``), then torch's report of each
    failed process, with that rank as the root cause where it was reported."""

    def __init__(self, name: str, failures: dict, first: Failure | None = None) -> None:
        self.first = first
        super().__init__(name, failures)

    def get_first_failure(self):
        rank = self.first.rank if self.first is not None and self.first.rank in self.failures else reported_first(self)
        return rank, self.failures[rank]

    @property
    def timestamp(self) -> float:
        """When the first failure happened (seconds since the epoch)."""
        return self.first.time if self.first is not None else float(self.get_first_failure()[1].timestamp)

    def headline(self) -> str:
        if self.first is not None:
            return f"{self.first.describe()} ({self.first.traceback_at()})."
        rank, failure = self.get_first_failure()
        return f"rank {rank} failed first: {_message(failure)} (its traceback: {failure.error_file})."

    def format_msg(self, boarder_delim: str = "=", section_delim: str = "-") -> str:
        text = self.headline()
        if self.first is not None and self.first.traceback:
            indented = self.first.traceback.rstrip().replace("\n", "\n  ")
            text += f"\nrank {self.first.rank}'s own error, as it recorded it:\n  {indented}"
        return f"{text}\n{super().format_msg(boarder_delim, section_delim)}"


class RankUserError(UserError, JobFailed):
    """A job whose first failing rank raised an error the user can fix (a ``UserError``: a full store,
    a bad loss, a setting or an input found on the rank), as one: its message is one line, 'rank N failed
    first, during <where>: <ExcType>: <message>', so that a command prints it as it prints any user
    error (``error: …``, exit status 2). The job's whole report (every failed rank, tracebacks) is its
    cause, a ``JobFailed``, which a traceback log holds; it is still a ``ChildFailedError``
    (``failures``, ``get_first_failure``) for callers that catch those."""

    def __init__(self, name: str, failures: dict, first: Failure) -> None:
        JobFailed.__init__(self, name, failures, first)
        self.args = (first.describe(),)  # what str() says; Flyte's local execution prefixes the task's name to it
