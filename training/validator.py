"""The validation loss during training: the run's curve gets held-out points, not only the final evaluation's.

Every ``train.val_every`` steps and at the last step, each rank runs the model forward on its rows of the
same ``train.val_batches`` global batches of the validation split (the loader's first batches: the same
rows each time, so the points compare), and the data-parallel mean joins the step's record as
``heldout_loss`` with ``heldout_batches`` (and its seconds, ``val_time_s``, outside the step time). From the
record it reaches metrics.jsonl, the step line, TensorBoard (``heldout/loss``), MLflow and the loss charts.
Its name is its own: the evaluation's ``val_loss`` of the final checkpoint reads more rows
(``evaluation.max_batches``) and is the figure the gate and the card use; these points are a few batches each. Forward only, with
no gradient and no random numbers drawn: the training is the same with it on or off (its settings are
observing ones, outside the run's identity). Its loader reads as the training loader does (``training.data.Reading``):
the first rank of each model-parallel group reads, through its node's shard cache, and broadcasts each batch to the
group, so every rank takes the same batches in the same order (``due`` is the same on every rank).
"""

from __future__ import annotations

import time

from training.callbacks import Record, StepCallback
from training.config import TrainConfig
from training.data import StreamingLoader
from training.model.step import TrainStep


class Validator(StepCallback):
    """Adds ``heldout_loss`` (and ``heldout_batches``) to the record of every ``cfg.val_every``-th step and of the last step."""

    def __init__(self, cfg: TrainConfig, step: TrainStep, loader: StreamingLoader | None, dp_rank: int, dp_size: int) -> None:
        self.cfg, self.step, self.loader = cfg, step, loader
        self.dp_rank, self.dp_size = dp_rank, dp_size

    def due(self, step: int) -> bool:
        if self.loader is None or self.cfg.val_every <= 0 or self.cfg.val_batches <= 0:
            return False
        return step % self.cfg.val_every == 0 or step == self.cfg.steps

    def after_step(self, record: Record) -> None:
        if "skipped" in record or not self.due(record["step"]):
            return
        started = time.perf_counter()
        batches = (self.loader.batch(i, self.dp_rank, self.dp_size) for i in range(self.cfg.val_batches))
        losses = [self.step.evaluate(batch.tokens) for batch in batches]
        record["heldout_loss"] = sum(losses) / len(losses)
        record["heldout_batches"] = len(losses)
        record["val_time_s"] = time.perf_counter() - started
