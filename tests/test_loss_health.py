"""Loss health (issue 16, item 5): NaN/Inf and spike detection, 'stop' with the batch's shards and rows,
'skip' leaving weights and optimizer state untouched, and a resume that keeps the health record.

The unit tests drive ``LossHealth`` directly; the runs are real 2-rank gloo jobs of the tiny model whose
loss function returns NaN at one step (``tests.helpers.train_with_bad_loss``), so the refusal goes
through ``TrainStep.step``'s accept hook with NaN gradients in place.
"""

from __future__ import annotations

import dataclasses
import json
import math
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
from torch.distributed.checkpoint.format_utils import dcp_to_torch_save
from torch.distributed.elastic.multiprocessing.errors import ChildFailedError

from common.contracts import health_key
from common.errors import UserError
from data_prep.shards import read_shard
from storage import open_store
from tests.helpers import fresh_copy, records, tiny_model, train_with_bad_loss
from training.checkpointing import checkpoint
from training.config import ParallelConfig, TrainConfig
from training.data import StreamingLoader
from training.launch import launch
from training.observe.health import MIN_HISTORY, WINDOW, BadLossError, LossHealth, describe_batch
from training.train import train

# -- LossHealth --------------------------------------------------------------------

ORIGIN = {
    "step": 7,
    "shards": [
        {"shard": "file:///store/datasets/v1/train/train-00003.tar", "rows": [3, 4, 5, 9]},
        {"shard": "file:///store/datasets/v1/train/train-00011.tar", "rows": [0]},
    ],
}


class Origins:
    """Stands in for ``StreamingLoader.origin``: counts how often the health check asked."""

    def __init__(self) -> None:
        self.asked = 0

    def __call__(self) -> dict:
        self.asked += 1
        return ORIGIN


def health(history: list[float] | None = None, **train) -> LossHealth:
    return LossHealth(TrainConfig(**train), history)


@pytest.mark.parametrize("loss", [math.nan, math.inf, -math.inf])
def test_nan_and_inf_are_bad_even_without_history_or_spike_check(loss):
    assert health().problem(loss) == f"loss is {loss}"
    assert health(loss_spike_factor=0).problem(loss) == f"loss is {loss}"
    assert health().problem(1e6) == ""  # finite and no history: nothing to compare with


def test_a_spike_counts_only_after_min_history_accepted_steps():
    checker, origins = health(loss_spike_factor=4.0, on_bad_loss="skip"), Origins()
    for step in range(1, MIN_HISTORY):
        assert checker.judge(step, 2.0, origins)
    assert checker.judge(MIN_HISTORY, 100.0, origins)  # one short of MIN_HISTORY before it: not judged
    assert len(checker.recent) == MIN_HISTORY and origins.asked == 0
    # Now MIN_HISTORY losses, median 2.0 (the 100 does not move it): the limit is 4 × 2.0, exclusive.
    assert checker.problem(8.0) == ""
    assert checker.problem(8.01) == "loss spiked to 8.0100, 4.0× the median 2.0000 of the last 20 steps"


def test_the_spike_limit_follows_the_median_of_the_last_window_of_losses():
    # One huge loss in the history: the median ignores it (a mean, ~52, would let 9.0 pass).
    assert health([2.0] * (MIN_HISTORY - 1) + [1000.0]).problem(9.0).startswith("loss spiked to 9.0000")
    # Only the last WINDOW losses count: the old level of 1.0 is forgotten.
    checker = health([1.0] * 100 + [10.0] * WINDOW)
    assert len(checker.recent) == WINDOW and checker.problem(39.0) == "" and checker.problem(41.0) != ""


def test_factor_zero_checks_only_nan_and_inf():
    checker, origins = health([2.0] * MIN_HISTORY, loss_spike_factor=0, on_bad_loss="skip"), Origins()
    assert checker.judge(21, 1e6, origins) and origins.asked == 0
    assert not checker.judge(22, math.nan, origins) and origins.asked == 1


def test_stop_raises_naming_the_step_the_loss_and_the_batch_shards_and_rows():
    checker, origins = health([2.0] * MIN_HISTORY, on_bad_loss="stop"), Origins()
    with pytest.raises(BadLossError) as caught:
        checker.judge(7, 50.0, origins)
    assert isinstance(caught.value, UserError)  # the CLI and Flyte show it without a traceback
    assert str(caught.value) == (
        "step 7: loss spiked to 50.0000, 25.0× the median 2.0000 of the last 20 steps; the batch came from "
        "file:///store/datasets/v1/train/train-00003.tar rows 3-5, 9, file:///store/datasets/v1/train/train-00011.tar "
        "rows 0. Inspect that data, lower train.lr, or set train.on_bad_loss: skip to drop such batches "
        "(train.loss_spike_factor: 0 checks NaN/Inf only)"
    )
    with pytest.raises(BadLossError, match=r"^step 8: loss is nan; the batch came from file:///store/.*train-00003\.tar"):
        checker.judge(8, math.nan, origins)
    # Recorded too, so that the run's health.jsonl says which data stopped it.
    assert [(e["step"], e["loss"], e["action"], e["batch"]) for e in checker.events] == [
        (7, 50.0, "stopped", ORIGIN),
        (8, "nan", "stopped", ORIGIN),
    ]
    assert checker.skipped == 0 and 50.0 not in checker.recent


def test_skip_refuses_the_step_and_records_the_event():
    checker, origins = health([2.0] * MIN_HISTORY, on_bad_loss="skip"), Origins()
    assert checker.judge(21, math.inf, origins) is False
    assert checker.judge(22, 2.1, origins) is True
    assert checker.skipped == 1 and list(checker.recent)[-1] == 2.1 and math.inf not in checker.recent
    assert checker.events == [{"step": 21, "loss": "inf", "problem": "loss is inf", "batch": ORIGIN, "action": "skipped"}]
    json.dumps(checker.events, allow_nan=False)  # strict JSON: a non-finite loss is written as a string


def test_more_skips_than_max_skipped_steps_stop_the_run():
    checker, origins = health(on_bad_loss="skip", max_skipped_steps=2), Origins()
    assert checker.judge(1, math.nan, origins) is False
    assert checker.judge(2, 3.0, origins) is True
    assert checker.judge(3, math.nan, origins) is False
    with pytest.raises(BadLossError) as caught:
        checker.judge(4, math.nan, origins)
    assert str(caught.value).startswith(
        "step 4: loss is nan; 3 steps had a bad loss, more than train.max_skipped_steps=2 may be skipped: the model, "
        "not the data, is likely broken (lower train.lr). This batch came from file:///store/"
    )
    assert [e["action"] for e in checker.events] == ["skipped", "skipped", "stopped"]
    with pytest.raises(BadLossError, match="1 steps had a bad loss, more than train.max_skipped_steps=0"):
        health(on_bad_loss="skip", max_skipped_steps=0).judge(1, math.nan, origins)


def test_describe_batch_shortens_long_row_lists_and_many_shards():
    rows = list(range(0, 40, 2))  # 20 separate rows
    batch = {"shards": [{"shard": f"s{i}", "rows": rows} for i in range(6)]}
    text = describe_batch(batch)
    assert text.startswith("s0 rows 0, 2, 4, 6, 8, 10, 12, 14, … (20 rows), s1 rows 0, 2,")
    assert (
        "s3 rows" in text
        and "s4" not in text
        and text.endswith(" and 2 more shards (every row: the event in the run's health.jsonl)")
    )
    # A batch across an epoch boundary may read a row twice: it is one run of rows, not a new one.
    assert describe_batch({"shards": [{"shard": "s", "rows": [1, 2, 2, 3, 7]}]}) == "s rows 1-3, 7"
    assert describe_batch({}) == "unknown shards"


def test_restore_from_the_metrics_gives_the_state_the_run_left():
    cfg = TrainConfig(on_bad_loss="skip", max_skipped_steps=3)
    live, origins = LossHealth(cfg), Origins()
    metrics = []
    losses = [5.0 - 0.1 * i for i in range(MIN_HISTORY + 5)] + [math.nan, 40.0, 2.4]
    for step, loss in enumerate(losses, start=1):
        record = {"step": step, "loss": loss}
        if not live.judge(step, loss, origins):  # as training.train records a refused step
            record |= {"skipped": True, "health": live.events[-1]}
        metrics.append(record)
    assert live.skipped == 2  # the NaN, then the spike
    # Through a checkpoint's JSONL copy, as a resume reads it.
    saved = [json.loads(json.dumps(m)) for m in metrics]
    restored = LossHealth.restore(cfg, saved)
    assert list(restored.recent) == list(live.recent) and restored.events == live.events and restored.skipped == 2
    # And it judges on as the live one does: one more skip is allowed, the next one stops.
    assert restored.judge(99, 1000.0, origins) is False and live.judge(99, 1000.0, origins) is False
    for checker in (restored, live):
        with pytest.raises(BadLossError, match="4 steps had a bad loss"):
            checker.judge(100, math.nan, origins)


# -- StreamingLoader.origin against the rows the loader hands out ------------------


def sorted_rows(rows: np.ndarray) -> np.ndarray:
    """The rows (``[n, seq_len + 1]``) in lexicographic order: a multiset to compare."""
    return rows[np.lexsort(rows.T[::-1])]


def test_origin_names_the_rows_of_the_global_batch_over_all_data_parallel_ranks(tiny_dataset):
    # origin() groups the rows by shard, sorted inside each, for inspection: the batch's order (a shuffle)
    # is not kept, so the rows it names are compared with the batch's as a multiset.
    global_batch, window_shards = 48, 2
    loader, _ = StreamingLoader.for_split(tiny_dataset, "train", global_batch, seed=3, window_shards=window_shards)
    with loader:
        window_rows = int(loader.order._plan(0)[1][1])  # rows of epoch 0's first window
        steps = [0, window_rows // global_batch, loader.order.rows // global_batch]  # first, across a window, across an epoch
        assert [len(loader.order.locate(loader.positions(s))) for s in steps] == [1, 2, 2]
        shard_rows: dict[str, np.ndarray] = {}
        for step in steps:
            origin = loader.origin(step)
            assert origin["step"] == step + 1 and len(origin["shards"]) > 1
            named = []
            for entry in origin["shards"]:
                rows = shard_rows.setdefault(entry["shard"], read_shard(entry["shard"]))
                named.append(rows[entry["rows"]])
            named = np.concatenate(named)
            assert len(named) == global_batch
            for dp_size in (2, 3):
                served = torch.cat([loader.batch(step, r, dp_size).tokens for r in range(dp_size)]).numpy()
                np.testing.assert_array_equal(sorted_rows(named), sorted_rows(served), err_msg=f"step {step}, dp {dp_size}")


# -- real 2-rank runs ----------------------------------------------------------------

MODEL = tiny_model()
BAD_STEP = 3
# Every step saved and kept: the checkpoints before and after the bad step are compared.
RUN = TrainConfig(
    steps=5, micro_batch_size=4, global_batch_size=8, warmup_steps=1, lr=3e-3, checkpoint_every=1, keep_checkpoints=0, seed=21
)
DP2 = ParallelConfig(tensor_parallel=1, collective_timeout_s=300)  # a loaded machine: not a test of timeouts


def bad_origin(dataset) -> dict:
    """Where the bad step's global batch came from, as the ranks' loader sees it."""
    loader, _ = StreamingLoader.for_split(
        dataset, "train", RUN.global_batch_size, RUN.seed, window_shards=RUN.shuffle_window_shards
    )
    with loader:
        return loader.origin(BAD_STEP - 1)


def the_run(store) -> str:
    """The one run in a store (its id hashes the training code, which may change while a test runs)."""
    runs = {key.split("/")[1] for key in store.list("runs/")}
    assert len(runs) == 1, runs
    return f"runs/{runs.pop()}"


def health_events(store, run: str) -> list[dict]:
    return [json.loads(line) for line in store.get_bytes(health_key(run)).decode().splitlines()]


def checkpoint_tensors(store, run: str, step: int, tmp: Path) -> tuple[dict[str, torch.Tensor], dict]:
    """Every tensor of a committed checkpoint (weights and optimizer state, whole) and its meta."""
    folder = checkpoint.fetch(store, checkpoint.checkpoint_prefix(run, step), tmp / f"step-{step}")
    dcp_to_torch_save(folder / checkpoint.CHECKPOINT_MODEL, tmp / f"step-{step}.pt")
    state = torch.load(tmp / f"step-{step}.pt", weights_only=False)
    tensors = {k: v for k, v in _flatten(state) if isinstance(v, torch.Tensor)}
    return tensors, json.loads((folder / checkpoint.CHECKPOINT_META).read_text())


def _flatten(state, prefix: str = ""):
    for key, value in state.items():
        if isinstance(value, dict):
            yield from _flatten(value, f"{prefix}{key}.")
        else:
            yield f"{prefix}{key}", value


def max_abs_diff(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor], keys: list[str]) -> float:
    return max((a[k].double() - b[k].double()).abs().max().item() for k in keys)


def assert_skipped_step_left_the_state_untouched(store, run: str, tmp: Path, label: str) -> None:
    """Checkpoints before and after the skipped step hold the same tensors; the next step changes them."""
    before, meta_before = checkpoint_tensors(store, run, BAD_STEP - 1, tmp)
    at, meta_at = checkpoint_tensors(store, run, BAD_STEP, tmp)
    after, meta_after = checkpoint_tensors(store, run, BAD_STEP + 1, tmp)
    assert sorted(before) == sorted(at) == sorted(after)
    weights = [k for k in before if "optimizer" not in k]
    state = [k for k in before if "optimizer" in k and before[k].numel() > 1]  # Adam moments (and main weights)
    assert weights and state, sorted(before)
    skipped = max_abs_diff(before, at, list(before))
    applied = max_abs_diff(at, after, weights), max_abs_diff(at, after, state)
    print(
        f"{label}: {len(weights)} weight and {len(state)} optimizer tensors; max |diff| step {BAD_STEP - 1} vs "
        f"{BAD_STEP} (skipped) = {skipped}, step {BAD_STEP} vs {BAD_STEP + 1} weights {applied[0]:.3g} optimizer {applied[1]:.3g}"
    )
    assert skipped == 0.0 and all(torch.isfinite(t).all() for t in at.values() if t.is_floating_point())
    assert min(applied) > 0  # the comparison sees an update when there is one
    assert meta_before["optimizer_step"] == meta_at["optimizer_step"] == meta_after["optimizer_step"] - 1


def assert_skip_recorded(ref, origin: dict) -> None:
    metrics = records(ref)
    assert [m["step"] for m in metrics] == list(range(1, RUN.steps + 1))
    assert [m["step"] for m in metrics if m.get("skipped")] == [BAD_STEP]
    bad = metrics[BAD_STEP - 1]
    assert math.isnan(bad["loss"]) and math.isnan(bad["grad_norm"])
    assert bad["health"] == {"step": BAD_STEP, "loss": "nan", "problem": "loss is nan", "batch": origin, "action": "skipped"}
    assert all(math.isfinite(m["loss"]) for m in metrics if m["step"] != BAD_STEP)
    assert health_events(open_store(ref.store), ref.run) == [bad["health"]]
    assert ref.summary["skipped_steps"] == 1


@pytest.fixture(scope="module")
def stopped(tiny_dataset, tmp_path_factory):
    """A DP=2 run whose step-3 loss is NaN on both ranks, with on_bad_loss 'stop': (dataset, the job's error)."""
    dataset = fresh_copy(tiny_dataset, tmp_path_factory.mktemp("health-store"))
    with pytest.raises(ChildFailedError) as caught:
        launch(train_with_bad_loss, 2, BAD_STEP, None, dataset, MODEL, DP2, RUN)
    return dataset, caught.value


@pytest.mark.slow
def test_stop_fails_the_job_naming_the_step_and_the_shards_and_commits_nothing_from_that_step(stopped):
    dataset, error = stopped
    origin = bad_origin(dataset)
    # Both ranks refused the step; elastic reports each rank's error with its message.
    messages = [failure.message for failure in error.failures.values()]
    print("stop message:", messages[0] if messages else error)
    expected = f"step {BAD_STEP}: loss is nan; the batch came from {describe_batch(origin)}. Inspect that data"
    assert messages and all(expected in m["message"] for m in messages if isinstance(m, dict)), messages
    assert expected in str(error) and "BadLossError" in str(error)
    assert all(s["shard"] in str(error) for s in origin["shards"])
    store = open_store(dataset.store)
    run = the_run(store)
    assert checkpoint.committed_steps(store, run) == list(range(1, BAD_STEP))
    assert not store.list(checkpoint.checkpoint_prefix(run, BAD_STEP))  # not even a partial upload
    # The event, with every row of the batch, is stored although the run failed.
    assert health_events(store, run) == [
        {"step": BAD_STEP, "loss": "nan", "problem": "loss is nan", "batch": origin, "action": "stopped"}
    ]


@pytest.fixture(scope="module")
def skipped(stopped):
    """The stopped run again with on_bad_loss 'skip', as its message advises: the same run resumes."""
    dataset, _ = stopped
    cfg = dataclasses.replace(RUN, on_bad_loss="skip")
    return launch(train_with_bad_loss, 2, BAD_STEP, None, dataset, MODEL, DP2, cfg)


@pytest.mark.slow
def test_skip_resumes_the_stopped_run_drops_the_bad_step_and_leaves_weights_untouched(stopped, skipped, tmp_path):
    dataset, _ = stopped
    store = open_store(dataset.store)
    assert skipped.run == the_run(store)  # on_bad_loss does not name the run: the stopped one resumed
    assert checkpoint.committed_steps(store, skipped.run) == list(range(1, RUN.steps + 1))
    assert_skip_recorded(skipped, bad_origin(dataset))
    assert_skipped_step_left_the_state_untouched(store, skipped.run, tmp_path, "LocalStep, DP=2")


@pytest.mark.slow
def test_a_resume_after_the_skipped_step_keeps_the_health_record(stopped, skipped, tmp_path):
    dataset, _ = stopped
    copy = fresh_copy(dataset, tmp_path / "store")
    store = open_store(copy.store)
    shutil.copytree(Path(dataset.store) / skipped.run, Path(copy.store) / skipped.run)
    store.delete_prefix(checkpoint.checkpoint_prefix(skipped.run, RUN.steps))  # as if it crashed after step 4
    store.delete_prefix(health_key(skipped.run))  # rewritten from the checkpoint's metrics, not left over
    cfg = dataclasses.replace(RUN, on_bad_loss="skip", max_skipped_steps=1)
    resumed = launch(train, 2, copy, MODEL, DP2, cfg)  # no NaN now: step 3 is history
    assert resumed.run == skipped.run
    assert_skip_recorded(resumed, bad_origin(dataset))  # the event as recorded then, in the first store
    first, again = records(skipped), records(resumed)
    assert [m["loss"] for m in again][BAD_STEP:] == pytest.approx([m["loss"] for m in first][BAD_STEP:], abs=1e-5)


@pytest.mark.slow
def test_distributed_optimizer_skips_without_an_optimizer_step_when_one_rank_sees_nan(tiny_dataset, tmp_path):
    # Megatron's optimizer applies NaN gradients as they are (no grad scaler in fp32): only the accept hook stops it.
    # The NaN is on rank 1 alone: the data-parallel mean tells rank 0, and both refuse the same step.
    dataset = fresh_copy(tiny_dataset, tmp_path / "store")
    parallel = dataclasses.replace(DP2, distributed_optimizer=True)
    cfg = dataclasses.replace(RUN, steps=BAD_STEP + 1, on_bad_loss="skip")
    ref = launch(train_with_bad_loss, 2, BAD_STEP, (1,), dataset, MODEL, parallel, cfg)
    metrics = records(ref)
    assert [m["step"] for m in metrics if m.get("skipped")] == [BAD_STEP] and math.isnan(metrics[BAD_STEP - 1]["loss"])
    assert metrics[BAD_STEP - 1]["health"]["batch"] == bad_origin(dataset)
    assert_skipped_step_left_the_state_untouched(open_store(ref.store), ref.run, tmp_path, "MegatronStep, distributed optimizer")
