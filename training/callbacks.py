"""What the training loop tells its observers, and in which order.

For each step ``N`` the loop calls, on every rank:

1. ``before_step(N)``, before the batch is read;
2. ``after_step(record)``, once the step is trained: ``record`` holds step, loss, lr, grad_norm,
   tokens_per_s, step_time_s, data_wait_s and the time breakdown; a callback may add figures to
   it. The callbacks run in the order they were given, so a later one sees what an earlier one added;
   the record is then kept (``training.runlog``) and copied into the step's checkpoint;
3. if the step saves a checkpoint, the save (its seconds join the record);
4. ``on_record(record)``, the step's final record;
5. ``on_save(N)``, if a checkpoint of step ``N`` was committed;

and ``close()`` once the last step is done. ``state_dict()`` is the files a callback keeps in every
checkpoint (``{name: bytes}``), so that a resume finds them consistent with the weights.

Adding an observer means writing one ``StepCallback`` and passing it to the Trainer.
Torch-free: the run bookkeeping implements it too.
"""

from __future__ import annotations

from typing import Any

Record = dict[str, Any]


class StepCallback:
    """An observer of the training loop. Every method does nothing unless overridden."""

    def before_step(self, step: int) -> None:
        """Step ``step`` (1-based) is about to run."""

    def after_step(self, record: Record) -> None:
        """Step ``record["step"]`` was trained: add figures to ``record`` (before it is kept and saved)."""

    def on_record(self, record: Record) -> None:
        """The step's final record (a checkpoint save's seconds included)."""

    def on_save(self, step: int) -> None:
        """A checkpoint of step ``step`` was committed."""

    def state_dict(self) -> dict[str, bytes]:
        """Files to keep in every checkpoint, by name."""
        return {}

    def close(self) -> None:
        """The last step is done."""


class Callbacks(StepCallback):
    """Several callbacks as one, called in their order."""

    def __init__(self, callbacks: list[StepCallback]) -> None:
        self.callbacks = callbacks

    def before_step(self, step: int) -> None:
        for callback in self.callbacks:
            callback.before_step(step)

    def after_step(self, record: Record) -> None:
        for callback in self.callbacks:
            callback.after_step(record)

    def on_record(self, record: Record) -> None:
        for callback in self.callbacks:
            callback.on_record(record)

    def on_save(self, step: int) -> None:
        for callback in self.callbacks:
            callback.on_save(step)

    def state_dict(self) -> dict[str, bytes]:
        return {name: data for callback in self.callbacks for name, data in callback.state_dict().items()}

    def close(self) -> None:
        for callback in self.callbacks:
            callback.close()


class OnRecord(StepCallback):
    """A function that hears each final record (e.g. the MLflow sender's queue; it must return at once)."""

    def __init__(self, hear) -> None:
        self.hear = hear

    def on_record(self, record: Record) -> None:
        self.hear(record)
