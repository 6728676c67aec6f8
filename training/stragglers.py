"""Stragglers: which rank holds the others back, found by exchanging step times every N steps.

In synchronous training every rank's step lasts as long as the slowest one's: the others wait
for it inside the collectives. So ranks are compared on their *busy* time, the step time minus
the time spent in collectives; a slow rank has the most of it. Every ``straggler_every`` steps
one all-gather brings every rank's per-step breakdown of the window to all ranks (one small
tensor, the window's only extra collective); rank 0 logs the slowest rank, its busy time over
the median rank's, and warns when the same rank is slower than ``straggler_ratio`` × median for
``straggler_windows`` windows in a row.
"""

from __future__ import annotations

import statistics

import torch
import torch.distributed as dist

from training.config import TrainConfig
from training.timing import BREAKDOWN_KEYS, phase_key

COLUMNS = ("step_s", *BREAKDOWN_KEYS)
"""One row per step and rank: the step's seconds and its breakdown."""


class StragglerMonitor:
    def __init__(self, cfg: TrainConfig, device: torch.device) -> None:
        self.every = cfg.straggler_every
        self.ratio = cfg.straggler_ratio
        self.windows = cfg.straggler_windows
        self.device = device
        self.rows: list[tuple[int, list[float]]] = []  # this rank's (step, COLUMNS) since the last exchange
        self.slow_rank = -1
        self.streak = 0

    def record(self, step: int, step_s: float, breakdown: dict[str, float]) -> None:
        if self.every:
            self.rows.append((step, [step_s, *(breakdown[k] for k in BREAKDOWN_KEYS)]))

    def due(self, step: int) -> bool:
        return bool(self.every) and step % self.every == 0 and bool(self.rows)

    def exchange(self) -> tuple[dict, list[dict]]:
        """Collective: every rank must call it at the same step. Returns the window's summary (the
        same on every rank) and each (step, rank)'s row for ``step_times.jsonl``."""
        steps = [step for step, _ in self.rows]
        mine = torch.tensor([row for _, row in self.rows], dtype=torch.float64, device=self.device)
        self.rows = []
        world = dist.get_world_size()
        gathered = torch.empty((world, *mine.shape), dtype=mine.dtype, device=self.device)
        dist.all_gather_into_tensor(gathered, mine)
        table = gathered.cpu()
        lines = [
            {"step": step, "rank": rank, **dict(zip(COLUMNS, table[rank, i].tolist(), strict=True))}
            for i, step in enumerate(steps)
            for rank in range(world)
        ]
        collective = COLUMNS.index(phase_key("collective"))
        busy = (table[:, :, 0] - table[:, :, collective]).sum(dim=1).tolist()
        slowest = max(range(world), key=busy.__getitem__)
        median = statistics.median(busy)
        ratio = busy[slowest] / median if median > 0 else 1.0
        if ratio > self.ratio:
            self.streak = self.streak + 1 if slowest == self.slow_rank else 1
            self.slow_rank = slowest
        else:
            self.streak, self.slow_rank = 0, -1
        summary = {
            "window": [steps[0], steps[-1]],
            "slowest_rank": slowest,
            "slowest_ratio": ratio,
            "rank_busy_s": busy,
        }
        if self.streak >= self.windows:
            summary["straggler_warning"] = (
                f"rank {slowest} has been the slowest for {self.streak} windows in a row (steps ending "
                f"{steps[-1]}): its busy time is {ratio:.2f}× the median rank's, above "
                f"train.straggler_ratio={self.ratio:g}; the other ranks wait for it in every collective. "
                "Check that rank's node (thermal throttling, a noisy neighbour, a slow disk or network)"
            )
        return summary, lines
