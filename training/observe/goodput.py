"""The goodput ledger's step callback: the training loop's edges, told to this attempt's ``AttemptLedger``
(``runs.ledger``, rank 0; the other ranks' callback does nothing).

Give it last among the callbacks: a step ends when every other callback has heard its final record, and a
save's time runs until the run's files are published (the run log's ``on_save``). The Trainer marks the
rest: the step it resumed after (``resumed``) and the attempt's end (``end``, however training ends).
"""

from __future__ import annotations

import time
from collections.abc import Callable

from runs.ledger import AttemptLedger
from storage import Store
from training.callbacks import Record, StepCallback
from training.observe.timing import phase_key

EVALUATION_KEY = "val_time_s"
"""The record's seconds of the validation loss (``training.validator``), outside the step time."""


class GoodputCallback(StepCallback):
    """Marks each step's start and end, each save and the end of the steps in the attempt's ledger."""

    def __init__(self, ledger: AttemptLedger | None, clock: Callable[[], float] = time.time) -> None:
        self.ledger, self.clock = ledger, clock
        self._stepping = False

    @classmethod
    def for_rank(cls, store: Store, run: str, rank0: bool) -> GoodputCallback:
        """Rank 0's writes the attempt's file (at once: a job killed while starting leaves its start-up); the
        other ranks' does nothing."""
        if not rank0:
            return cls(None)
        ledger = AttemptLedger(store, run)
        ledger.write()
        return cls(ledger, ledger.clock)

    def resumed(self, step: int) -> None:
        """The attempt continues after step ``step`` (0: from the start)."""
        if self.ledger is not None:
            self.ledger.resumed(step)

    def before_step(self, step: int) -> None:
        if self.ledger is not None and not self._stepping:
            self._stepping = True
            self.ledger.begin_steps(self.clock())

    def on_record(self, record: Record) -> None:
        if self.ledger is None:
            return
        self.ledger.step_done(
            int(record["step"]),
            self.clock(),
            data_s=float(record.get(phase_key("data")) or 0.0),
            checkpoint_s=float(record.get(phase_key("checkpoint")) or 0.0),
            evaluation_s=float(record.get(EVALUATION_KEY) or 0.0),
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
