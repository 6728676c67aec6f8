"""Where each step's time goes, per rank (issue 16 item 2): the phase timer, and what real 2-rank runs
write of it to metrics.jsonl, step_times.jsonl and TensorBoard."""

from __future__ import annotations

import dataclasses
import json
import time

import pytest
import torch

from storage import open_store
from tests.helpers import fresh_copy, run_metrics, tiny_model, train_with_slow_rank
from training.config import ParallelConfig, TrainConfig
from training.launch import launch
from training.observe.stragglers import COLUMNS
from training.observe.timing import BREAKDOWN_KEYS, PHASES, StepTimer, phase_key
from training.train import train

# Checkpoints at steps 3 and 6; exchanges after steps 2, 4 and 6, so every step is in one window.
STEPS = TrainConfig(
    steps=6, micro_batch_size=4, global_batch_size=8, warmup_steps=1, checkpoint_every=3, straggler_every=2, log_every=1
)
# The phases' seconds are summed in float64 and 'other' is the step's time less that sum: the
# breakdown adds up to step_time_s up to rounding. JSON keeps float64 exactly.
SUM_TOLERANCE_S = 1e-9
DELAY_S = 1.0  # the megatron run's rank 1 reads each batch this much slower (far above load noise)


def step_times(store, run: str) -> list[dict]:
    return [json.loads(line) for line in store.get_bytes(f"{run}/step_times.jsonl").decode().splitlines()]


@pytest.fixture(scope="module")
def dp2_run(tiny_dataset, tmp_path_factory):
    """Data parallel over 2 ranks (LocalStep): the gradients are all-reduced every step."""
    dataset = fresh_copy(tiny_dataset, tmp_path_factory.mktemp("dp2") / "store")
    return launch(train, 2, dataset, tiny_model(), ParallelConfig(tensor_parallel=1), STEPS)


def check_breakdown(records: list[dict]) -> None:
    """Every record has every phase, none negative, and they add up to the step's time."""
    assert [r["step"] for r in records] == list(range(1, STEPS.steps + 1))
    for r in records:
        assert set(BREAKDOWN_KEYS) <= r.keys(), r
        assert all(r[k] >= 0 for k in BREAKDOWN_KEYS), r
        assert sum(r[k] for k in BREAKDOWN_KEYS) == pytest.approx(r["step_time_s"], abs=SUM_TOLERANCE_S), r
        for phase in ("data", "forward_backward", "collective", "optimizer"):
            assert r[phase_key(phase)] > 0, (phase, r)
        saved = r["step"] % STEPS.checkpoint_every == 0
        assert (r[phase_key("checkpoint")] > 0) == saved, r


@pytest.mark.slow
def test_data_parallel_steps_break_down_into_measured_phases(dp2_run):
    store = open_store(dp2_run.store)
    records = run_metrics(store, dp2_run.run)
    check_breakdown(records)
    # tokens/s is the training's: a checkpoint step's save is in step_time_s, not in the throughput.
    tokens = STEPS.global_batch_size * 32
    for r in records:
        assert tokens / r["tokens_per_s"] == pytest.approx(r["step_time_s"] - r[phase_key("checkpoint")], rel=1e-9), r
    exchanged = [r for r in records if "slowest_rank" in r]
    assert [r["window"] for r in exchanged] == [[1, 2], [3, 4], [5, 6]]
    assert not store.list(f"{dp2_run.run}/tensorboard/plugins")  # train.profile '' stores no trace


def test_step_times_hold_every_rank_of_every_step(dp2_run):
    store = open_store(dp2_run.store)
    records = {r["step"]: r for r in run_metrics(store, dp2_run.run)}
    lines = step_times(store, dp2_run.run)
    assert sorted((line["step"], line["rank"]) for line in lines) == [(s, rank) for s in range(1, 7) for rank in (0, 1)]
    for line in lines:
        assert set(line) == {"step", "rank", *COLUMNS}
        assert all(line[c] >= 0 for c in COLUMNS), line
        # A row is the step before its checkpoint save: its phases add up to its step_s.
        assert sum(line[c] for c in COLUMNS[1:]) == pytest.approx(line["step_s"], abs=SUM_TOLERANCE_S), line
        if line["rank"] == 0:  # rank 0's own row is its metrics record, gathered back in rank order
            r = records[line["step"]]
            for phase in ("data", "forward_backward", "collective", "optimizer"):
                assert line[phase_key(phase)] == r[phase_key(phase)], (phase, line, r)
    # Each window's busy seconds are the rows' step time less their collective waits.
    for r in records.values():
        if "rank_busy_s" in r:
            first, last = r["window"]
            window = [x for x in lines if first <= x["step"] <= last]
            busy = [sum(x["step_s"] - x[phase_key("collective")] for x in window if x["rank"] == rank) for rank in (0, 1)]
            assert r["rank_busy_s"] == pytest.approx(busy, rel=1e-9)
            assert r["slowest_rank"] == max((0, 1), key=busy.__getitem__)


def test_tensorboard_shows_the_breakdown_of_every_step(dp2_run, tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    store = open_store(dp2_run.store)
    records = run_metrics(store, dp2_run.run)
    scalars = EventAccumulator(str(store.download_dir(f"{dp2_run.run}/tensorboard", tmp_path / "tb"))).Reload()
    for key in (*BREAKDOWN_KEYS, "step_time_s"):
        events = scalars.Scalars(f"train/{key}")
        assert [e.step for e in events] == [r["step"] for r in records], key
        # The final figures, a checkpoint step's save included (TensorBoard stores float32).
        assert [e.value for e in events] == pytest.approx([r[key] for r in records], rel=1e-6, abs=1e-9), key
    assert [e.step for e in scalars.Scalars("train/slowest_ratio")] == [2, 4, 6]


@pytest.mark.slow
def test_megatron_finalize_grads_wait_counts_as_collective(tiny_dataset, tmp_path):
    """megatron's DDP with the distributed optimizer reduces the gradients in finalize_model_grads,
    inside its schedule. Rank 1 reads each batch DELAY_S late, so rank 0 waits for it in that first
    collective of the step: the wait must show as rank 0's collective time, not forward+backward."""
    parallel = ParallelConfig(tensor_parallel=1, distributed_optimizer=True)
    steps = dataclasses.replace(STEPS, steps=4, checkpoint_every=4, straggler_every=4)
    ref = launch(train_with_slow_rank, 2, 1, DELAY_S, fresh_copy(tiny_dataset, tmp_path / "store"), tiny_model(), parallel, steps)
    store = open_store(ref.store)
    records = run_metrics(store, ref.run)
    assert [r["step"] for r in records] == [1, 2, 3, 4]
    for r in records:
        assert set(BREAKDOWN_KEYS) <= r.keys() and all(r[k] >= 0 for k in BREAKDOWN_KEYS), r
        assert sum(r[k] for k in BREAKDOWN_KEYS) == pytest.approx(r["step_time_s"], abs=SUM_TOLERANCE_S), r
        # Rank 0 (these records) waited about DELAY_S for rank 1 every step, in the gradient reduction.
        assert r[phase_key("collective")] > DELAY_S / 2, r
        assert r[phase_key("forward_backward")] < DELAY_S / 2, r
    rows = {(x["step"], x["rank"]): x for x in step_times(store, ref.run)}
    assert sorted(rows) == [(s, rank) for s in range(1, 5) for rank in (0, 1)]
    for s in range(1, 5):  # rank 1 spent the delay reading its batch, and waited for no one
        assert rows[s, 1][phase_key("data")] > DELAY_S, rows[s, 1]
        assert rows[s, 1][phase_key("collective")] < DELAY_S / 2, rows[s, 1]
    assert records[-1]["slowest_rank"] == 1


def test_step_timer_takes_an_inner_phase_out_of_the_outer_one():
    heard: list[tuple[int, str]] = []
    timer = StepTimer(torch.device("cpu"), on_phase=lambda step, phase: heard.append((step, phase)))
    timer.start(7)
    t0 = time.perf_counter()
    with timer.phase("forward_backward"):
        time.sleep(0.1)
        with timer.phase("collective"):
            time.sleep(0.3)
        time.sleep(0.1)
        with timer.phase("collective"):  # a second time: the seconds add up
            time.sleep(0.1)
    outer_s = time.perf_counter() - t0
    with timer.phase("optimizer"):
        time.sleep(0.05)
    total = timer.elapsed()
    seconds = timer.breakdown(total)

    assert seconds[phase_key("collective")] >= 0.4
    assert seconds[phase_key("forward_backward")] >= 0.2
    # Counted once: the outer phase's own time is its span less the inner phases'.
    assert seconds[phase_key("forward_backward")] + seconds[phase_key("collective")] <= outer_s
    assert seconds[phase_key("forward_backward")] <= outer_s - 0.4
    assert seconds[phase_key("optimizer")] >= 0.05
    assert seconds[phase_key("data")] == seconds[phase_key("checkpoint")] == 0
    assert sum(seconds.values()) == pytest.approx(total, abs=SUM_TOLERANCE_S)
    assert set(seconds) == set(BREAKDOWN_KEYS) and len(BREAKDOWN_KEYS) == len(PHASES) + 1
    # The hang diagnostics hear where the rank is, also when it is back in the outer phase.
    assert heard == [
        (7, "forward_backward"),
        (7, "collective"),
        (7, "forward_backward"),
        (7, "collective"),
        (7, "forward_backward"),
        (7, "optimizer"),
    ]

    timer.start(8)  # a new step starts from zero
    assert all(v == 0 for k, v in timer.breakdown(0.0).items())
    with pytest.raises(ValueError, match="unknown step phase 'backward'"):
        with timer.phase("backward"):
            pass
