"""The goodput ledger of a real two-rank run that failed after a save and was resumed: two attempt files, in the
order of their lease's sequence, whose parts add up to the run's wall time, infrastructure recovery and wasted
progress, and the ledger as `pretrain runs show` and `runs list` print it and the Step time Deck draws it. The
ledger's arithmetic: tests/test_goodput.py."""

from __future__ import annotations

import json
import time

import pytest

from cli.main import main as cli
from runs.ledger import PARTS, goodput_prefix, load_goodput, read_attempts
from runs.reading import load_run
from storage import open_store
from tests.helpers import fresh_copy, html_charts, run_decks, svg_ids, tiny_model, train_with_error
from training.config import ParallelConfig, TrainConfig
from training.launch import launch
from training.observe.failures import JobFailed
from training.train import train

pytestmark = pytest.mark.slow

MODEL = tiny_model()
FAIL_STEP = 7
"""Rank 0 fails fetching step 7's batch: steps 5 and 6, after the save at 4, are trained again on resume."""
# Saves at 4 and 8, the validation loss at 4 and 8; a seed of its own, so no other test shares the run id. Saves
# complete before the next step: a background save of step 4 still uploading when step 7 fails is abandoned (a CI
# run on a loaded machine resumed from step 0 so), and this test is of the ledger, not of that race.
CFG = TrainConfig(
    steps=8,
    micro_batch_size=4,
    global_batch_size=8,
    warmup_steps=2,
    lr=3e-3,
    checkpoint_every=4,
    val_every=4,
    seed=3030,
    async_checkpoints=False,
)
PARALLEL = ParallelConfig(tensor_parallel=1, collective_timeout_s=300)  # a loaded machine: not a test of timeouts


@pytest.fixture(scope="module")
def resumed_run(tiny_dataset, tmp_path_factory):
    """The failed attempt, then the resumed one; with the seconds the test itself measured around both."""
    dataset = fresh_copy(tiny_dataset, tmp_path_factory.mktemp("goodput"))
    started = time.time()
    with pytest.raises(JobFailed, match=f"boom at step {FAIL_STEP}"):
        launch(train_with_error, 2, FAIL_STEP, 0, dataset, MODEL, PARALLEL, CFG)
    ref = launch(train, 2, dataset, MODEL, PARALLEL, CFG)
    return ref, time.time() - started


def test_the_parts_add_up_to_the_wall_time_over_a_failure_and_its_resume(resumed_run):
    ref, measured_s = resumed_run
    store = open_store(ref.store)
    failed, resumed = read_attempts(store, ref.run)
    assert (failed["resumed_step"], failed["last_step"], resumed["resumed_step"], resumed["last_step"]) == (0, 6, 4, 8)
    assert sorted(failed["productive_at_step"]) == [4] and sorted(resumed["productive_at_step"]) == [8]
    assert (failed["sequence"], resumed["sequence"]) == (1, 2)  # the lease's, one take each
    for attempt in (failed, resumed):  # each attempt adds up by construction
        assert sum(attempt["parts"].values()) == pytest.approx(attempt["updated_at"] - attempt["started_at"], abs=1e-6)
        assert attempt["started_at"] < attempt["leased_at"] < attempt["updated_at"]
        assert attempt["parts"]["checkpoint_restore"] > 0  # the lease to the end of the resume
    goodput = load_goodput(store, ref.run)
    print(json.dumps(goodput.to_dict(), indent=2))
    assert goodput.attempts == 2 and goodput.skew_s == 0.0 and goodput.warnings == ()
    # The wall time is the clocks' (first process start to last update), inside what the test measured around both
    # launches; the parts sum to it within 1 %.
    assert 0 < goodput.wall_s <= measured_s
    assert abs(sum(goodput.parts.values()) - goodput.wall_s) <= 0.01 * goodput.wall_s
    assert all(goodput.parts[part] > 0 for part in PARTS if part != "compile"), goodput.parts  # not compiled on CPU
    wasted = failed["parts"]["productive"] - failed["productive_at_step"][4]
    assert goodput.parts["wasted_progress"] == pytest.approx(wasted)
    gap = resumed["started_at"] - failed["updated_at"]
    assert gap > 0 and goodput.parts["infrastructure_recovery"] == pytest.approx(gap)
    assert goodput.parts["startup"] == pytest.approx(failed["parts"]["startup"] + resumed["parts"]["startup"])
    assert goodput.fraction == pytest.approx(goodput.parts["productive"] / goodput.wall_s)


def test_runs_show_list_and_the_deck_give_the_real_runs_goodput(resumed_run, capsys):
    ref, _ = resumed_run
    store = open_store(ref.store)
    run_id = ref.run.removeprefix("runs/")
    goodput = load_goodput(store, ref.run)
    capsys.readouterr()
    assert cli(["runs", "show", run_id, "--store", store.uri, "--json"]) == 0
    shown = json.loads(capsys.readouterr().out)
    assert shown["goodput"] == goodput.to_dict() and shown["files"]["goodput"] == store.url(goodput_prefix(ref.run))
    assert cli(["runs", "show", run_id, "--store", store.uri]) == 0
    text = capsys.readouterr().out
    print(text)
    assert f"goodput: {goodput.fraction:.1%} of {goodput.wall_s:.1f} s wall time productive, over 2 attempts" in text
    assert cli(["runs", "list", "--store", store.uri]) == 0
    assert f"goodput {goodput.fraction:.1%}" in capsys.readouterr().out
    bar = html_charts(run_decks(load_run(store, run_id))["Step time"])[0]
    assert svg_ids(bar, "goodput-") == [f"goodput-{part}" for part in PARTS if goodput.parts[part] > 0]
