"""The goodput ledger's step callback: the training loop's edges, told to this attempt's ``AttemptLedger``
(``runs.ledger``, rank 0; the other ranks' callback does nothing).

Give it last among the callbacks: a step ends when every other callback has heard its final record, and a
save's time runs until the run's files are published (the run log's ``on_save``). The Trainer marks the
rest: the lease and the resume around the checkpoint manager's start (``restore_begins``, ``restored``: the
lease's sequence orders the run's attempts), the step it resumed after (``resumed``) and the attempt's end
(``end``, however training ends). A step's compiling (the rise of ``compile_seconds``) is the ledger's
``compile``, not ``productive``.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from runs.lease import RunLease
from runs.ledger import AttemptLedger
from storage import Store
from training.callbacks import Record, StepCallback
from training.observe.timing import compile_seconds, phase_key

EVALUATION_KEY = "val_time_s"
"""The record's seconds of the validation loss (``training.validator``), outside the step time."""


class GoodputCallback(StepCallback):
    """Marks the resume, each step's start and end, each save and the end of the steps in the attempt's ledger."""

    def __init__(
        self,
        ledger: AttemptLedger | None,
        clock: Callable[[], float] | None = None,
        compiled: Callable[[], float] = compile_seconds,
    ) -> None:
        self.ledger, self.compiled = ledger, compiled
        self.clock = clock or (ledger.clock if ledger is not None else time.time)
        self._stepping = False
        self._compiled = 0.0
        """This process's compiling seconds at the last step's end (``compiled``)."""

    @classmethod
    def for_rank(cls, store: Store, run: str, rank0: bool) -> GoodputCallback:
        """Rank 0's writes the attempt's file (at once: a job killed while starting leaves its start-up); the
        other ranks' does nothing."""
        if not rank0:
            return cls(None)
        ledger = AttemptLedger(store, run)
        ledger.write()
        ledger.start_heartbeat()
        return cls(ledger, ledger.clock)

    def restore_begins(self) -> None:
        """The checkpoint manager's start begins: the run's lease, then the resume."""
        if self.ledger is not None:
            self.ledger.restore_begins(self.clock())

    def leased(self, lease: RunLease | None) -> None:
        """Rank 0's lease (None elsewhere) was taken: when, and its sequence (the order of the run's attempts), in
        the attempt's file at once (an attempt killed in its resume is still placed)."""
        if self.ledger is None or lease is None or lease.acquired_at is None:
            return
        now = self.clock()
        self.ledger.leased(lease.sequence, now - max(0.0, time.monotonic() - lease.acquired_at))
        self.ledger.write()

    def restored(self) -> None:
        """The resume is over."""
        if self.ledger is not None:
            self.ledger.restore_done(self.clock())

    def resumed(self, step: int) -> None:
        """The attempt continues after step ``step`` (0: from the start)."""
        if self.ledger is not None:
            self.ledger.resumed(step)

    def before_step(self, step: int) -> None:
        if self.ledger is not None and not self._stepping:
            self._stepping = True
            self.ledger.begin_steps(self.clock())
            self._compiled = self.compiled()

    def on_record(self, record: Record) -> None:
        if self.ledger is None:
            return
        compiled, self._compiled = self._compiled, self.compiled()
        self.ledger.step_done(
            int(record["step"]),
            self.clock(),
            data_s=float(record.get(phase_key("data")) or 0.0),
            checkpoint_s=float(record.get(phase_key("checkpoint")) or 0.0),
            evaluation_s=float(record.get(EVALUATION_KEY) or 0.0),
            compile_s=self._compiled - compiled,
        )

    def on_save(self, step: int) -> None:
        if self.ledger is not None:
            self.ledger.saved(step, self.clock())

    def close(self) -> None:
        if self.ledger is not None:
            self.ledger.begin_shutdown(self.clock())

    def end(self) -> None:
        """The attempt is over (after the run's files and the lease, or on a failure): its file's last write."""
        if self.ledger is not None:
            self.ledger.end(self.clock())
