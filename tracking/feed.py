"""The live feed handed from rank 0 to the process that launched the ranks.

Rank 0 appends each final step record to a local file (``FeedWriter``: one JSON line, flushed; a
local write, no network); the launching process tails that file (``relay``) and hands the records
to its ``LiveSender``. MLflow's client (about 2 s of imports, and for a SQLite URI 1 s of schema
checks) loads in the launcher, which waits on its ranks and, in a local execution, has it loaded
already (the pipeline's first task opened the run), not in rank 0 beside training: 3-4 s of CPU a
training run on the 2-core machine. Where no launcher relays (``FEED_ENV`` unset), rank 0 sends itself.
"""

from __future__ import annotations

import contextlib
import json
import os
import tempfile
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, TextIO

from tracking.sender import LiveSender, to_stderr

FEED_ENV = "PRETRAIN_LIVE_FEED"
"""Where rank 0 appends its step records: set by the launcher's ``relay`` for the ranks it starts."""

POLL_S = 0.2
"""How often the relay looks for new records."""


class FeedWriter:
    """Rank 0's end: each final step record as a JSON line, written through at once. It never fails
    training: a feed it cannot write (its file gone, a full disk) ends with one warning, and the pipeline's
    last task sends the records from the store, as after any outage."""

    def __init__(self, path: str, log: Callable[[str], None] | None = None) -> None:
        self.path = path
        self.log = log or to_stderr
        self._file: TextIO | None = None
        try:
            self._file = open(path, "a", encoding="utf-8")  # noqa: SIM115 - closed by close(), at the end of training
        except OSError as e:
            self._stop(e, "at the start")

    def send(self, record: dict[str, Any]) -> None:
        if self._file is None:
            return
        try:
            self._file.write(json.dumps(record) + "\n")
            self._file.flush()
        except (OSError, TypeError, ValueError) as e:
            self._stop(e, f"at step {record.get('step')}")

    def close(self) -> int:
        if self._file is not None:
            with contextlib.suppress(OSError):
                self._file.close()
            self._file = None
        return 0

    def _stop(self, error: Exception, when: str) -> None:
        self.close()
        self.log(
            f"WARNING: tracking: the live feed to MLflow stopped {when} ({type(error).__name__}: {error}; feed {self.path}); "
            "the pipeline's last step (track_run) sends the step records from the store"
        )


@contextmanager
def relay(uri: str, run_id: str, timeout_s: float, flush_s: float) -> Iterator[str]:
    """A feed file (private to this user, removed at the end) whose records go to MLflow run ``run_id``
    while the block runs; at its end the records left are read, and sent within ``flush_s`` (else the
    pipeline's last task replays them from the store, as for rank 0's own sender)."""
    fd, path = tempfile.mkstemp(prefix="pretrain-live-feed-", suffix=".jsonl")
    os.close(fd)
    sender = LiveSender(uri, run_id, timeout_s, flush_s)
    done = threading.Event()

    def tail() -> None:
        with open(path, encoding="utf-8") as feed:
            partial = ""
            while True:
                ended = done.is_set()  # before the read: what the ranks wrote before the end is read after it
                chunk = feed.read()
                *lines, partial = (partial + chunk).split("\n")
                for line in lines:
                    with contextlib.suppress(ValueError):  # not a record (never written so): the replay has it
                        sender.send(json.loads(line))
                if not chunk:
                    if ended:
                        return
                    done.wait(POLL_S)

    reader = threading.Thread(target=tail, name="live-feed", daemon=True)
    reader.start()
    try:
        yield path
    finally:
        done.set()
        reader.join(timeout=timeout_s + 1.0)
        sender.close()
        os.unlink(path)
