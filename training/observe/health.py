"""Loss health: a NaN/Inf loss or a spike stops the run or drops the batch, and says which data it was.

Each bad loss is an event (step, loss, why, the batch's shards and rows, skipped or stopped) that
the run log (``training.runlog``) stores in the run's health.jsonl, and for a skipped step in its metrics record.
Every rank sees the same mean loss (``TrainStep`` reduces it before asking), so every rank takes
the same decision without another collective. A spike is a loss above ``loss_spike_factor`` × the
median of the last ``WINDOW`` accepted losses, checked once ``MIN_HISTORY`` of them exist (the
first steps fall fast and say nothing about the normal level).
"""

from __future__ import annotations

import math
import statistics
from collections import deque
from collections.abc import Callable

from common.errors import UserError
from runs.records import row_ranges
from training.callbacks import Record, StepCallback
from training.config import BadLossAction, TrainConfig

WINDOW = 50
MIN_HISTORY = 20
SHARDS_SHOWN = 4  # in a message; the event lists every shard


class BadLossError(UserError, FloatingPointError):
    """Training stopped on a NaN/Inf or spiking loss (``train.on_bad_loss: stop``)."""


class LossHealth(StepCallback):
    """Judges each step's loss; the events it records go to the metrics and the run's summary."""

    def __init__(self, cfg: TrainConfig, history: list[float] | None = None) -> None:
        self.factor = cfg.loss_spike_factor
        self.action = cfg.on_bad_loss
        self.max_skipped = cfg.max_skipped_steps
        self.recent: deque[float] = deque((history or [])[-WINDOW:], maxlen=WINDOW)
        self.skipped = 0
        self.events: list[dict] = []

    @classmethod
    def restore(cls, cfg: TrainConfig, metrics: list[dict]) -> LossHealth:
        """The state after the steps of ``metrics`` (a checkpoint's copy, one record per step): the
        accepted losses, the skipped steps and their events, as the run that trained them left it."""
        health = cls(cfg, [m["loss"] for m in metrics if not m.get("skipped")])
        health.events = [m["health"] for m in metrics if "health" in m]
        health.skipped = sum(1 for m in metrics if m.get("skipped"))
        return health

    def after_step(self, record: Record) -> None:
        """A step whose update ``judge`` refused is marked skipped, with its event."""
        if self.events and self.events[-1]["step"] == record["step"] and self.events[-1].get("action") == "skipped":
            record["skipped"] = True
            record["health"] = self.events[-1]

    def problem(self, loss: float) -> str:
        """Why ``loss`` is bad ('' when it is fine)."""
        if not math.isfinite(loss):
            return f"loss is {loss}"
        if self.factor and len(self.recent) >= MIN_HISTORY:
            median = statistics.median(self.recent)
            if loss > self.factor * median:
                return (
                    f"loss spiked to {loss:.4f}, {loss / median:.1f}× the median {median:.4f} "
                    f"of the last {len(self.recent)} steps"
                )
        return ""

    def judge(self, step: int, loss: float, origin: Callable[[], dict]) -> bool:
        """True to apply the step's update. ``origin()`` says where the batch's rows came from (shards,
        rows; asked only for a bad loss). Raises ``BadLossError`` when the action is 'stop' or too many
        steps were skipped; the event is recorded either way (``events``), so that the run's health.jsonl
        says which data it was even when the run stopped."""
        problem = self.problem(loss)
        if not problem:
            self.recent.append(loss)
            return True
        batch = origin()
        event = {"step": step, "loss": loss if math.isfinite(loss) else str(loss), "problem": problem, "batch": batch}
        self.events.append(event)
        where = describe_batch(batch)
        if self.action == BadLossAction.STOP:
            event["action"] = "stopped"
            raise BadLossError(
                f"step {step}: {problem}; the batch came from {where}. Inspect that data, lower train.lr, or set "
                "train.on_bad_loss: skip to drop such batches (train.loss_spike_factor: 0 checks NaN/Inf only)"
            )
        self.skipped += 1
        if self.skipped > self.max_skipped:
            event["action"] = "stopped"
            raise BadLossError(
                f"step {step}: {problem}; {self.skipped} steps had a bad loss, more than train.max_skipped_steps="
                f"{self.max_skipped} may be skipped: the model, not the data, is likely broken (lower train.lr). "
                f"This batch came from {where}"
            )
        event["action"] = "skipped"
        return False


def describe_batch(batch: dict, rows_shown: int = 8) -> str:
    """'shard …/train-00003.tar rows 5, 16-18, 40, …' for a message: each shard and the rows read
    from it (indices inside the shard), the first ``rows_shown`` runs of rows of the first
    ``SHARDS_SHOWN`` shards; the event in the run's health.jsonl holds them all."""
    shards = batch.get("shards", [])
    if not shards:
        return "unknown shards"
    parts = [f"{s['shard']} rows {row_ranges(s['rows'], rows_shown)}" for s in shards[:SHARDS_SHOWN]]
    more = len(shards) - SHARDS_SHOWN
    text = ", ".join(parts) + (f" and {more} more shards" if more > 0 else "")
    return text + (" (every row: the event in the run's health.jsonl)" if more > 0 or "…" in text else "")
