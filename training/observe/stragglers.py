"""Stragglers: which rank holds the others back, found by exchanging step times every N steps.

In synchronous training every rank's step lasts as long as the slowest one's: the others wait
for it inside the collectives. So ranks are compared on their *busy* time, the step time minus
the time spent in collectives; a slow rank has the most of it. Every ``straggler_every`` steps
(and at the run's last step) one all-gather brings every rank's per-step breakdown of the
window to all ranks (one small tensor, the window's only extra collective); rank 0 logs the
slowest rank and its busy time over the median of the other ranks', and warns when the same
rank is slower than ``straggler_ratio`` × that median for ``straggler_windows`` windows in a row.

The median is the *other* ranks': with the slow rank counted in, a 2-rank job could never show
a ratio above 2 (the median of two is their mean), and one twice as slow as its peer would read
1.33. In a large job the two medians are the same.

Checkpoint saves are left out of the rows: rank 0 does more of the writing, and a save is not a
step of training whose time the ranks share.
"""

from __future__ import annotations

import statistics
import sys
from collections.abc import Callable
from typing import TYPE_CHECKING

import torch
import torch.distributed as dist

from training.callbacks import Record, StepCallback
from training.config import TrainConfig
from training.observe.timing import BREAKDOWN_KEYS, phase_key

if TYPE_CHECKING:
    from training.observe.watchdog import Progress

# torch 2.13 renamed all_gather_into_tensor (deprecated, warns on every call) to all_gather_single.
_all_gather = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor

COLUMNS = ("step_s", *(k for k in BREAKDOWN_KEYS if k != phase_key("checkpoint")))
"""One row per step and rank: the step's seconds (its checkpoint save left out) and its breakdown."""


class StragglerMonitor(StepCallback):
    """Collects this rank's step times and, at each exchange, compares all ranks'.

    As a callback (``after_step``) it adds the exchange's summary to the record of the step that ends
    a window, hands every rank's rows to ``keep`` (the run log's step times) and warns on rank 0.
    """

    def __init__(
        self,
        cfg: TrainConfig,
        device: torch.device,
        progress: Progress | None = None,
        keep: Callable[[list[dict]], None] | None = None,
        rank0: bool = False,
    ) -> None:
        self.steps, self.progress, self.keep, self.rank0 = cfg.steps, progress, keep, rank0
        self.every = cfg.straggler_every
        self.ratio = cfg.straggler_ratio
        self.windows = cfg.straggler_windows
        self.device = device
        self.rows: list[tuple[int, list[float]]] = []  # this rank's (step, COLUMNS) since the last exchange
        self.slow_rank = -1
        self.streak = 0
        """Windows in a row in which ``slow_rank`` was slower than ``ratio`` × the others' median."""

    def after_step(self, record: Record) -> None:
        step = record["step"]
        self.record(step, record["step_time_s"], record)
        if not self.due(step, last=step == self.steps):
            return
        if self.progress is not None:
            self.progress.at(step, "straggler exchange")
        summary, lines = self.exchange()
        record |= summary
        if self.keep is not None:
            self.keep(lines)
        if self.rank0 and "straggler_warning" in summary:
            print(f"WARNING: {summary['straggler_warning']}", file=sys.stderr, flush=True)

    def record(self, step: int, step_s: float, breakdown: dict[str, float]) -> None:
        """This rank's step ``step``: its seconds (without a checkpoint save) and their breakdown."""
        if self.every:
            self.rows.append((step, [step_s, *(breakdown[k] for k in COLUMNS[1:])]))

    def due(self, step: int, last: bool = False) -> bool:
        """Whether the ranks exchange after step ``step``: every ``straggler_every`` steps, and at the
        run's ``last`` step for the steps since the previous exchange. The same on every rank."""
        return bool(self.every) and bool(self.rows) and (step % self.every == 0 or last)

    def exchange(self) -> tuple[dict, list[dict]]:
        """Collective: every rank must call it at the same step. Returns the window's summary (the
        same on every rank) and each (step, rank)'s row for ``step_times.jsonl``."""
        steps = [step for step, _ in self.rows]
        mine = torch.tensor([row for _, row in self.rows], dtype=torch.float64, device=self.device)
        self.rows = []
        world = dist.get_world_size()
        # The output is the ranks' tensors one after the other along dim 0 (gloo takes no other shape).
        gathered = torch.empty((world * mine.shape[0], mine.shape[1]), dtype=mine.dtype, device=self.device)
        _all_gather(gathered, mine)
        table = gathered.cpu().view(world, *mine.shape)
        lines = [
            {"step": step, "rank": rank, **dict(zip(COLUMNS, table[rank, i].tolist(), strict=True))}
            for i, step in enumerate(steps)
            for rank in range(world)
        ]
        busy = (table[:, :, 0] - table[:, :, COLUMNS.index(phase_key("collective"))]).sum(dim=1).tolist()
        return self.judge(busy, (steps[0], steps[-1])), lines

    def judge(self, busy: list[float], window: tuple[int, int]) -> dict:
        """The verdict on the window of steps ``window`` (first, last) from each rank's busy seconds in
        it; updates the streak. Pure: the same on every rank, given the same gathered times."""
        slowest = max(range(len(busy)), key=busy.__getitem__)
        others = busy[:slowest] + busy[slowest + 1 :]
        median = statistics.median(others) if others else busy[slowest]
        ratio = busy[slowest] / median if median > 0 else 1.0
        if ratio > self.ratio:
            self.streak = self.streak + 1 if slowest == self.slow_rank else 1
            self.slow_rank = slowest
        else:
            self.streak, self.slow_rank = 0, -1
        summary = {"window": list(window), "slowest_rank": slowest, "slowest_ratio": ratio, "rank_busy_s": busy}
        # Once per streak: the metrics of every later window still name the rank and its ratio.
        if self.streak == self.windows:
            summary["straggler_warning"] = (
                f"rank {slowest} has been the slowest for {self.streak} straggler windows in a row (steps up to "
                f"{window[1]}): its busy time "
                f"(step time less collective waits) is {ratio:.2f}× the median of the other ranks', above "
                f"train.straggler_ratio={self.ratio:g}, and the other ranks wait for it in every collective. "
                "Check that rank's node (thermal throttling, a noisy neighbour, a slow disk or network)"
            )
        return summary
