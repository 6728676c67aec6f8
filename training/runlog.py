"""The run log, a step callback (the files themselves: ``runs.records``): a run's metrics (one record per
step), every rank's step times and its health events.

They live in the run's folder (``metrics.jsonl``, ``step_times.jsonl``, ``health.jsonl``), published
by rank 0 after each checkpoint and at the end, and copies of the first two are kept in every
checkpoint: a resume takes the checkpoint's copies (the run's files may be newer than the weights, or
older, after a crash right after a commit). Torch-free.
"""

from __future__ import annotations

from pathlib import Path

from common.contracts import METRICS, STEP_TIMES, LayoutSpan, health_key, metrics_key, step_times_key
from runs.records import jsonl, read_jsonl
from storage import Store
from storage.local import LocalStore
from training.callbacks import Record, StepCallback


class RunLog(StepCallback):
    """Keeps each step's record (``after_step``: give it after the callbacks that add figures) and
    publishes the run's files after each checkpoint (rank 0)."""

    def __init__(self, store: Store, run: str, rank0: bool) -> None:
        self.store, self.run, self.rank0 = store, run, rank0
        self.metrics: list[Record] = []
        self.step_times: list[dict] = []
        """Every rank's step breakdown, gathered at each straggler exchange (rank 0)."""
        self.events: list[dict] = []
        """The loss health events (``LossHealth.events``: the Trainer hands its list over)."""

    def restore(self, checkpoint: str, step: int, node_copy: Path | None = None) -> None:
        """The log as the checkpoint of step ``step`` kept it: the one under key prefix ``checkpoint``, or the
        folder ``node_copy`` (a checkpoint this node saved only, ``train.local_checkpoint_every``)."""
        saved, prefix = (LocalStore(str(node_copy)), "") if node_copy is not None else (self.store, checkpoint)
        self.metrics = _lines(saved, prefix, METRICS, step)
        # A checkpoint's copy of its own step's record lacks the save's time; the run's file has it once published.
        published = {r["step"]: r for r in _lines(self.store, self.run, METRICS, step)}
        same = [published.get(r["step"], {}).get("loss") == r["loss"] for r in self.metrics]
        self.metrics = [published[r["step"]] if kept else r for r, kept in zip(self.metrics, same, strict=True)]
        self.step_times = _lines(saved, prefix, STEP_TIMES, step)

    def after_step(self, record: Record) -> None:
        self.metrics.append(record)

    def add_step_times(self, lines: list[dict]) -> None:
        if self.rank0:
            self.step_times.extend(lines)

    def state_dict(self) -> dict[str, bytes]:
        return {METRICS: jsonl(self.metrics), STEP_TIMES: jsonl(self.step_times)}

    def on_save(self, step: int) -> None:
        self.publish()

    def publish(self) -> None:
        """The run's current metrics, per-rank step times and health events (rank 0; others return)."""
        if not self.rank0:
            return
        self.store.put_bytes(metrics_key(self.run), jsonl(self.metrics))
        self.store.put_bytes(step_times_key(self.run), jsonl(self.step_times))
        self.store.put_bytes(health_key(self.run), jsonl(self.events))

    def summary(self, layouts: list[LayoutSpan], skipped: int, sizes: dict[str, float]) -> dict[str, float]:
        """The run's headline figures (``CheckpointRef.summary``): losses, throughput, ``sizes`` (the
        model's and the run's), the skipped steps and MFU."""
        applied = [m for m in self.metrics if "skipped" not in m]  # a skipped step's loss may be NaN
        last = applied[-10:] or [{"loss": float("nan"), "tokens_per_s": 0.0}]
        # Throughput is that of the layout that trained the last steps (this call's only if it trained them).
        final = [m for m in self.metrics if m["step"] >= layouts[-1].first_step]
        summary = {
            "final_train_loss": sum(m["loss"] for m in last) / len(last),
            "first_train_loss": applied[0]["loss"] if applied else float("nan"),
            "tokens_per_second": sorted(m["tokens_per_s"] for m in final)[len(final) // 2] if final else 0.0,
            **sizes,
        }
        if skipped:
            summary["skipped_steps"] = float(skipped)
        mfus = sorted(m["mfu"] for m in final if m.get("mfu") is not None)
        if mfus:  # unknown GPUs have no peak to compare with
            summary["mfu"] = mfus[len(mfus) // 2]
        return summary


def _lines(store: Store, prefix: str, name: str, step: int) -> list[dict]:
    """A JSONL file's records up to step ``step`` (the file ``name`` under key prefix ``prefix``; '' = the top)."""
    return [r for r in read_jsonl(store, f"{prefix}/{name}" if prefix else name) if r["step"] <= step]
