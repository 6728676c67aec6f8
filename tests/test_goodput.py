"""The goodput ledger without training: one attempt's file as the loop's edges fill it (a clock the test moves),
attempts combined (a kill after a save, a gap, a resume; an overlap), and what reads it: `pretrain runs show` and
`runs list`, the MLflow run's metrics and the Step time Deck's bar. A real killed and resumed run:
tests/test_goodput_run.py."""

from __future__ import annotations

import json
import uuid

import pytest

from cli.main import main as cli
from common.contracts import metrics_key
from registry.registry import register
from runs.ledger import PARTS, AttemptLedger, Goodput, _attempt, attempt_key, combine, goodput_prefix, load_goodput
from runs.reading import load_run
from storage import Store, open_store
from tests.helpers import html_charts, registry_inputs, report, run_decks, svg_ids, svg_texts
from tracking.client import client, experiment_id, start_run
from tracking.mirror import record_execution
from training.observe.goodput import GoodputCallback

RUN = "runs/r1"


class Clock:
    """A clock the test sets."""

    def __init__(self, now: float) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def attempt(started: float, updated: float, resumed: int, last: int, parts: dict[str, float], saved: dict[int, float]) -> dict:
    """An attempt file's record, as ``AttemptLedger.record`` writes it."""
    assert abs(sum(parts.values()) - (updated - started)) < 1e-9, "a hand-made attempt must add up"
    return {
        "format": 1,
        "started_at": started,
        "updated_at": updated,
        "resumed_step": resumed,
        "last_step": last,
        "ended": True,
        "parts": parts,
        "productive_at_step": {str(k): v for k, v in saved.items()},
    }


def parts(startup: float, productive: float, data: float, checkpoint: float, evaluation: float, shutdown: float) -> dict:
    return {
        "startup": startup,
        "productive": productive,
        "data_wait": data,
        "checkpoint_stall": checkpoint,
        "evaluation": evaluation,
        "shutdown": shutdown,
    }


# Killed after its save at step 4, having finished steps 5 and 6 (20 s of productive time after the save, trained
# again), 30 s before the next attempt starts; that one resumes from step 4 and finishes at step 8.
KILLED = attempt(1000.0, 1100.0, 0, 6, parts(10, 60, 5, 20, 3, 2), {4: 40.0})
RESUMED = attempt(1130.0, 1200.0, 4, 8, parts(12, 40, 4, 10, 2, 2), {8: 40.0})


def plant(store: Store, *attempts: dict) -> None:
    for record in attempts:
        store.put_json(attempt_key(RUN, record["started_at"]), record)


def test_one_attempt_splits_its_time_contiguously_and_adds_up(tmp_path):
    store = open_store(str(tmp_path / "store"))
    clock = Clock(100.0)
    ledger = AttemptLedger(store, RUN, started_at=100.0, clock=clock)
    callback = GoodputCallback(ledger, clock)
    callback.resumed(0)
    clock.now = 105.0
    callback.before_step(1)  # start-up ends: process start to the first step
    clock.now = 107.0
    callback.on_record({"step": 1, "time_data_s": 0.5, "time_checkpoint_s": 0.0})
    callback.before_step(2)
    clock.now = 110.0
    callback.on_record({"step": 2, "time_data_s": 0.25, "time_checkpoint_s": 1.0, "val_time_s": 0.5})
    clock.now = 110.5
    callback.on_save(2)  # the run log's publish after the save: checkpoint stall too
    clock.now = 111.0
    callback.close()
    clock.now = 113.0
    callback.end()
    callback.end()  # once only
    (key,) = store.list(f"{goodput_prefix(RUN)}/")
    record = store.get_json(key)
    assert record["parts"] == pytest.approx(parts(5.0, 1.5 + 1.25, 0.75, 1.5, 0.5, 2.5))
    assert sum(record["parts"].values()) == pytest.approx(record["updated_at"] - record["started_at"]) == 13.0
    assert (record["resumed_step"], record["last_step"], record["ended"]) == (0, 2, True)
    assert record["productive_at_step"] == {"2": pytest.approx(2.75)}
    goodput = load_goodput(store, RUN)
    assert goodput.attempts == 1 and goodput.wall_s == 13.0 and goodput.fraction == pytest.approx(2.75 / 13.0)
    assert goodput.parts["restarts"] == goodput.parts["retrained"] == 0.0 and abs(goodput.unaccounted_s) < 1e-9


def test_an_attempt_that_fails_mid_step_keeps_its_heartbeat_and_its_partial_step(tmp_path):
    store = open_store(str(tmp_path / "store"))
    clock = Clock(0.0)
    ledger = AttemptLedger(store, RUN, started_at=0.0, clock=clock, heartbeat_s=10.0)
    callback = GoodputCallback(ledger, clock)
    clock.now = 2.0
    callback.before_step(1)
    for step in range(1, 8):  # 3 s a step: rewritten at the first step past 10 s since the last write (2 s)
        clock.now += 3.0
        callback.on_record({"step": step, "time_data_s": 1.0})
        if step == 3:
            assert store.get_json(ledger.key)["updated_at"] == 2.0  # 9 s since the last write: not yet
    heartbeat = store.get_json(ledger.key)
    assert heartbeat["updated_at"] == 14.0 and heartbeat["last_step"] == 4  # the write at 10 s past the one before
    clock.now = 24.5
    callback.end()  # a failure in step 8: its half step is productive time (a resume moves it to retrained)
    record = store.get_json(ledger.key)
    assert record["updated_at"] == 24.5 and record["parts"]["productive"] == pytest.approx(7 * 2.0 + 1.5)
    assert record["parts"]["startup"] == 2.0 and record["parts"]["data_wait"] == 7.0 and record["parts"]["shutdown"] == 0.0


def test_other_ranks_write_nothing(tmp_path):
    store = open_store(str(tmp_path / "store"))
    callback = GoodputCallback.for_rank(store, RUN, rank0=False)
    callback.before_step(1)
    callback.on_record({"step": 1})
    callback.on_save(1)
    callback.close()
    callback.end()
    assert store.list("") == [] and load_goodput(store, RUN) is None


def test_a_killed_attempt_and_its_resume_combine_into_restarts_and_retrained_steps(tmp_path):
    store = open_store(str(tmp_path / "store"))
    plant(store, RESUMED, KILLED)  # read in start order, whatever the listing's
    store.put_bytes(f"{goodput_prefix(RUN)}/attempt-planted.json", b"{not json")  # left out
    goodput = load_goodput(store, RUN)
    assert goodput.attempts == 2 and goodput.wall_s == 200.0
    assert goodput.parts == pytest.approx(
        {
            "startup": 10.0,  # the first attempt's only
            "productive": 60.0 + 40.0 - 20.0,
            "data_wait": 9.0,
            "checkpoint_stall": 30.0,
            "evaluation": 5.0,
            "shutdown": 4.0,
            "restarts": 30.0 + 12.0,  # the gap, then the second start-up: failure to resumed step
            "retrained": 60.0 - 40.0,  # steps 5-6, trained after the save the resume came from
        }
    )
    assert list(goodput.parts) == list(PARTS)
    assert goodput.fraction == pytest.approx(0.4) and goodput.unaccounted_s == pytest.approx(0.0)
    assert goodput.to_dict() == {
        "fraction": goodput.fraction,
        "wall_s": 200.0,
        "attempts": 2,
        "parts": goodput.parts,
        "unaccounted_s": goodput.unaccounted_s,
    }


def test_a_resume_past_the_last_step_retrains_nothing_and_an_overlap_is_not_counted_twice(tmp_path):
    store = open_store(str(tmp_path / "store"))
    done = attempt(0.0, 100.0, 0, 8, parts(10, 70, 5, 10, 3, 2), {4: 30.0, 8: 70.0})
    # An identical execution started at 90 s, waited for the lease until 100 s, found step 8 done: 15 s of start-up,
    # of which the last 5 s came after the first one's end.
    twin = attempt(90.0, 107.0, 8, None, parts(15, 0, 0, 0, 0, 2), {})
    plant(store, done, twin)
    goodput = load_goodput(store, RUN)
    assert goodput.parts["retrained"] == 0.0 and goodput.parts["restarts"] == pytest.approx(5.0)
    assert goodput.wall_s == 107.0 and goodput.unaccounted_s == pytest.approx(0.0)


def test_runs_show_and_list_print_the_goodput_and_give_it_in_json(tmp_path, capsys):
    store = open_store(str(tmp_path / "store"))
    plant(store, KILLED, RESUMED)
    capsys.readouterr()
    assert cli(["runs", "show", "r1", "--store", store.uri, "--json"]) == 0
    shown = json.loads(capsys.readouterr().out)["goodput"]
    assert shown == load_goodput(store, RUN).to_dict() and shown["fraction"] == pytest.approx(0.4)
    assert cli(["runs", "show", "r1", "--store", store.uri]) == 0
    text = capsys.readouterr().out
    assert "goodput: 40.0% of 200.0 s wall time productive, over 2 attempts" in text
    lines = {line.split()[0]: line.split()[1:] for line in text.splitlines() if line.startswith("  ") and line.split()}
    assert lines["productive"] == ["80.00", "40.0%"] and lines["restarts"] == ["42.00", "21.0%"]
    assert lines["retrained"] == ["20.00", "10.0%"] and lines["data_wait"] == ["9.00", "4.5%"]
    assert lines["unaccounted"] == ["0.00"]
    assert cli(["runs", "list", "--store", store.uri]) == 0
    assert "goodput 40.0%" in capsys.readouterr().out
    assert cli(["runs", "list", "--store", store.uri, "--json"]) == 0
    assert json.loads(capsys.readouterr().out)[0]["goodput"] == pytest.approx(0.4)


def test_a_run_without_a_ledger_says_so(tmp_path, capsys):
    store = open_store(str(tmp_path / "store"))
    store.put_bytes(metrics_key(RUN), json.dumps({"step": 1, "loss": 2.0}).encode() + b"\n")
    capsys.readouterr()
    assert cli(["runs", "show", "r1", "--store", store.uri]) == 0
    assert "goodput: not recorded" in capsys.readouterr().out
    assert cli(["runs", "list", "--store", store.uri]) == 0
    assert "goodput -" in capsys.readouterr().out
    assert "goodput</h3><p>not recorded" in run_decks(load_run(store, "r1"))["Step time"]


def test_the_step_time_deck_draws_the_wall_time_as_one_bar_with_seconds(tmp_path):
    store = open_store(str(tmp_path / "store"))
    plant(store, KILLED, RESUMED)
    html = run_decks(load_run(store, "r1"))["Step time"]
    assert "40.0% of 200.0 s wall time in productive steps, over 2 attempts" in html
    bar = html_charts(html)[0]
    assert svg_ids(bar, "goodput-") == [f"goodput-{p}" for p in PARTS]  # one segment a part, in order
    legend = set(svg_texts(bar))
    assert {"productive: 80.0 s (40.0%)", "restarts: 42.0 s (21.0%)", "retrained: 20.0 s (10.0%)"} <= legend, legend
    assert "data wait: 9.0 s (4.5%)" in legend and "checkpoint stall: 30.0 s (15.0%)" in legend


def test_the_mlflow_run_gets_the_goodput_and_each_part(tmp_path, mlflow_tracking_uri):
    store = registry_inputs(open_store(str(tmp_path / "store")))
    store.put_bytes(metrics_key(RUN), b"".join(json.dumps({"step": s, "loss": 2.0}).encode() + b"\n" for s in (1, 10)))
    plant(store, KILLED, RESUMED)
    model = register(store, f"gpt-{uuid.uuid4().hex[:6]}", report(2.0))
    mlflow = client(mlflow_tracking_uri)
    exp = experiment_id(mlflow, f"test-{uuid.uuid4().hex[:8]}", mlflow_tracking_uri)
    run_id = start_run(mlflow, exp, f"local-{uuid.uuid4().hex[:8]}", {}, {})
    record_execution(mlflow, mlflow_tracking_uri, mlflow.get_experiment(exp).name, "exec-1", run_id, store, model, {})
    metrics = mlflow.get_run(run_id).data.metrics
    expected = Goodput(200.0, load_goodput(store, RUN).parts, 2)
    assert metrics["goodput"] == pytest.approx(0.4) and metrics["goodput_wall_s"] == 200.0
    assert {p: metrics[f"goodput_{p}_s"] for p in PARTS} == pytest.approx(expected.parts)
    assert [m.step for m in mlflow.get_metric_history(run_id, "goodput")] == [10]  # at the run's last step


@pytest.mark.parametrize(
    "change",
    [
        {"parts": {**KILLED["parts"], "productive": float("inf")}},
        {"parts": {**KILLED["parts"], "productive": float("nan")}},
        {"parts": {**KILLED["parts"], "startup": -1e6}},
        {"parts": {**KILLED["parts"], "shutdown": 1e12}},  # finite, far past its 100 s span
        {"productive_at_step": {"4": float("inf")}},
        {"resumed_step": -5},
    ],
    ids=["infinite", "nan", "negative", "past-its-span", "infinite-save", "negative-step"],
)
def test_an_attempt_file_with_impossible_seconds_is_left_out_and_every_reader_still_answers(tmp_path, capsys, change):
    """Issue 50 finding 5: an attempt file with ``Infinity``, ``NaN`` or negative parts crashed ``runs list`` (every
    run hidden), printed ``goodput inf%`` and failed ``runs report``."""
    store = open_store(str(tmp_path / "store"))
    plant(store, RESUMED, {**KILLED, **change})
    assert load_goodput(store, RUN).to_dict() == combine([_attempt(RESUMED)]).to_dict()  # the planted one left out
    capsys.readouterr()
    assert cli(["runs", "list", "--store", store.uri]) == 0
    listed = capsys.readouterr().out
    assert "r1" in listed and "inf" not in listed and "nan" not in listed
    assert cli(["runs", "show", "r1", "--store", store.uri]) == 0
    shown = capsys.readouterr().out
    assert "goodput: " in shown and "inf" not in shown and "nan" not in shown and "-" not in shown.split("goodput:")[1][:12]
    assert cli(["runs", "report", "r1", "--store", store.uri, "--out", str(tmp_path / "report.html")]) == 0
