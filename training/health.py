"""Loss health: a NaN/Inf loss or a spike stops the run or drops the batch, and says which data it was.

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
from training.config import BadLossAction, TrainConfig

WINDOW = 50
MIN_HISTORY = 20


class BadLossError(UserError, FloatingPointError):
    """Training stopped on a NaN/Inf or spiking loss (``train.on_bad_loss: stop``)."""


class LossHealth:
    """Judges each step's loss; the events it records go to the metrics and the run's summary."""

    def __init__(self, cfg: TrainConfig, history: list[float] | None = None) -> None:
        self.factor = cfg.loss_spike_factor
        self.action = cfg.on_bad_loss
        self.max_skipped = cfg.max_skipped_steps
        self.recent: deque[float] = deque((history or [])[-WINDOW:], maxlen=WINDOW)
        self.skipped = 0
        self.events: list[dict] = []

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
        steps were skipped."""
        problem = self.problem(loss)
        if not problem:
            self.recent.append(loss)
            return True
        batch = origin()
        event = {"step": step, "loss": loss if math.isfinite(loss) else str(loss), "problem": problem, "batch": batch}
        where = describe_batch(batch)
        if self.action == BadLossAction.STOP:
            raise BadLossError(
                f"step {step}: {problem}; the batch came from {where}. Inspect that data, lower train.lr, or set "
                "train.on_bad_loss: skip to drop such batches (train.loss_spike_factor: 0 checks NaN/Inf only)"
            )
        self.skipped += 1
        event["action"] = "skipped"
        self.events.append(event)
        if self.skipped > self.max_skipped:
            raise BadLossError(
                f"step {step}: {problem}; {self.skipped} steps were skipped, more than train.max_skipped_steps="
                f"{self.max_skipped}: the model, not the data, is likely broken (lower train.lr). Last batch: {where}"
            )
        return False


def describe_batch(batch: dict) -> str:
    """'shard …/train-00003.tar rows 16-23, …' for a message."""
    parts = [f"{s['shard']} rows {s['rows'][0]}-{s['rows'][-1]}" for s in batch.get("shards", [])[:4]]
    more = len(batch.get("shards", [])) - 4
    return ", ".join(parts) + (f" and {more} more shards" if more > 0 else "") if parts else "unknown shards"
