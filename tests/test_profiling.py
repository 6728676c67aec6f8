"""Profiles on demand (issue 16 item 1): ``train.profile`` runs torch.profiler over a window of steps
on every rank and stores one gzip'd Chrome trace per rank where TensorBoard's profiler plugin and
Perfetto read it; the setting is checked, and it does not change the run id."""

from __future__ import annotations

import dataclasses
import gzip
import json
from collections import Counter

import pytest
import torch

from common.contracts import profile_prefix
from storage import open_store
from tests.helpers import fresh_copy, tiny_model
from training.config import ParallelConfig, TrainConfig
from training.launch import launch
from training.observe.profiling import WindowProfiler
from training.train import run_id, train

STEPS = TrainConfig(steps=4, micro_batch_size=4, global_batch_size=8, warmup_steps=1, checkpoint_every=4, profile="2-3")
OPTIMIZER_STEP = "Optimizer.step#AdamW.step"  # torch's annotation of each AdamW.step() call


def trace_events(data: bytes) -> list[dict]:
    """A stored trace: gzip'd Chrome trace JSON, as Perfetto and TensorBoard's plugin read it."""
    trace = json.loads(gzip.decompress(data))
    assert isinstance(trace["traceEvents"], list)
    return trace["traceEvents"]


@pytest.mark.slow
def test_a_profiled_window_stores_one_trace_per_rank(tiny_dataset, tmp_path):
    ref = launch(train, 2, fresh_copy(tiny_dataset, tmp_path / "store"), tiny_model(), ParallelConfig(tensor_parallel=1), STEPS)
    store = open_store(ref.store)
    window = profile_prefix(ref.run, 2, 3)
    assert window == f"{ref.run}/tensorboard/plugins/profile/steps_0000002-0000003"
    assert store.list(f"{ref.run}/tensorboard/plugins") == [f"{window}/rank_{rank:05d}.pt.trace.json.gz" for rank in (0, 1)]
    for rank in (0, 1):
        events = trace_events(store.get_bytes(f"{window}/rank_{rank:05d}.pt.trace.json.gz"))
        names = Counter(e.get("name") for e in events)
        ops = {name for name in names if name and name.startswith("aten::")}
        assert {"aten::mm", "aten::embedding"} & ops and len(ops) > 20, sorted(ops)
        # Exactly the window's two steps: each ran the optimizer once.
        assert names[OPTIMIZER_STEP] == 2, names.most_common(30)
        assert any(e.get("cat") == "cpu_op" and "Input Dims" in e.get("args", {}) for e in events)  # shapes recorded
        assert names["[memory]"] > 0  # allocations recorded


def test_no_profile_no_trace_and_a_window_cut_short_by_the_run_end(tmp_path):
    """The profiler on its own, around real torch work on this process (no ranks needed)."""
    store = open_store(str(tmp_path / "store"))
    model = torch.nn.Linear(8, 8)
    optimizer = torch.optim.AdamW(model.parameters())

    def run(profile: str, steps: int, run: str) -> WindowProfiler:
        profiler = WindowProfiler(TrainConfig(profile=profile), store, run, 3, torch.device("cpu"))
        for step in range(1, steps + 1):
            profiler.before_step(step)
            model(torch.randn(2, 8)).sum().backward()
            optimizer.step()
            optimizer.zero_grad()
            profiler.after_step({"step": step})
        profiler.finish(steps)
        return profiler

    assert run("", 4, "runs/off").stored == [] and store.list("runs/off") == []
    # A window past the run's end is cut at its last step: steps 3-4 of a '3-9' window.
    cut = run("3-9", 4, "runs/cut")
    assert cut.stored == store.list("runs/cut") == [f"{profile_prefix('runs/cut', 3, 4)}/rank_00003.pt.trace.json.gz"]
    assert Counter(e.get("name") for e in trace_events(store.get_bytes(cut.stored[0])))[OPTIMIZER_STEP] == 2
    one = run("2", 4, "runs/one")  # a single step
    assert one.stored == [f"{profile_prefix('runs/one', 2, 2)}/rank_00003.pt.trace.json.gz"]
    assert Counter(e.get("name") for e in trace_events(store.get_bytes(one.stored[0])))[OPTIMIZER_STEP] == 1


@pytest.mark.parametrize("profile", ["3-2", "x", "0", "0-2", "-3", "2-3-4", "1.5"])
def test_a_profile_window_that_cannot_work_is_a_config_problem(profile):
    problems = TrainConfig(profile=profile).problems()
    assert [p for p in problems if p.startswith("train.profile")] == [
        f"train.profile is {profile!r}: give steps as 'FIRST-LAST' or 'STEP' (1-based), e.g. '11-13'"
    ]
    assert TrainConfig(profile=profile).profile_window() is None


@pytest.mark.parametrize("profile,window", [("", None), ("2-3", (2, 3)), (" 11-13 ", (11, 13)), ("5", (5, 5))])
def test_a_valid_profile_window(profile, window):
    assert TrainConfig(profile=profile).profile_window() == window
    assert not [p for p in TrainConfig(profile=profile).problems() if p.startswith("train.profile")]


def test_observing_settings_do_not_change_the_run_id(tiny_dataset):
    model = tiny_model()
    base = run_id(tiny_dataset, model, STEPS)
    observed = dataclasses.replace(
        STEPS,
        profile="5-6",
        profile_stacks=True,
        log_every=1,
        straggler_every=2,
        straggler_ratio=3.0,
        straggler_windows=5,
        tensorboard=False,
    )
    assert run_id(tiny_dataset, model, dataclasses.replace(STEPS, profile="")) == base
    assert run_id(tiny_dataset, model, observed) == base
    # What trains differently names another run.
    assert run_id(tiny_dataset, model, dataclasses.replace(STEPS, steps=5)) != base
    assert run_id(tiny_dataset, model, dataclasses.replace(STEPS, lr=1e-3)) != base
