"""Stage markers (``common.stages``) and how the soak reads them (``benchmarks/soak.py``): where a
kill is aimed and in which stage it is counted, from the run's own markers, with no pipeline run."""

from __future__ import annotations

import importlib.util
import os
import sys
import time
from pathlib import Path
from types import ModuleType

import pytest

from common.stages import ENV, Marker, mark_stage, parse_markers, read_markers

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def soak() -> ModuleType:
    """benchmarks/soak.py as a module (a script, not a package): its functions are pure."""
    spec = importlib.util.spec_from_file_location("soak_under_test", ROOT / "benchmarks" / "soak.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module


def markers(*names: str, start: float = 100.0) -> list[Marker]:
    """Markers one second apart, from ``start``."""
    return [Marker(name, start + i) for i, name in enumerate(names)]


# -- common.stages ---------------------------------------------------------------------------------


def test_mark_stage_does_nothing_without_the_variable(tmp_path, monkeypatch):
    monkeypatch.delenv(ENV, raising=False)
    monkeypatch.chdir(tmp_path)
    mark_stage("prepare")
    assert list(tmp_path.iterdir()) == []


def test_mark_stage_appends_one_line_per_call(tmp_path, monkeypatch):
    path = tmp_path / "markers.txt"
    path.write_text("prepare 1.5\n")  # a line already there stays: appended, never truncated
    monkeypatch.setenv(ENV, str(path))
    before = time.time()
    mark_stage("validate")
    mark_stage("train-step")
    after = time.time()
    found = read_markers(path)
    assert [m.name for m in found] == ["prepare", "validate", "train-step"]
    assert found[0].at == 1.5 and before <= found[1].at <= found[2].at <= after
    assert (found[0].pid, found[1].pid, found[2].pid) == (0, os.getpid(), os.getpid())  # who to kill for a rank's fault
    assert path.read_text().count("\n") == 3


def test_mark_stage_never_breaks_the_work_it_marks(tmp_path, monkeypatch):
    monkeypatch.setenv(ENV, str(tmp_path / "gone" / "markers.txt"))  # its folder is not there: OSError
    mark_stage("train")
    with pytest.raises(ValueError, match="one word"):
        mark_stage("train step")  # a name the reader could not split


def test_parse_markers_skips_a_line_being_written_and_malformed_ones():
    text = "prepare 1.0\nnonsense\n 2.0\nvalidate 3.5 812\ncheckpoint 4 x\ntrain 4"  # the last line is being written
    assert parse_markers(text) == [Marker("prepare", 1.0), Marker("validate", 3.5, 812)]
    assert read_markers(Path("/nonexistent/markers.txt")) == []


# -- the soak: where a kill landed -----------------------------------------------------------------


def test_a_kill_before_any_marker_is_in_no_stage(soak):
    """The old soak's evaluate kills: 0.2-3.4 s after `pretrain run` started, while the CLI still
    imported. The store then already showed every checkpoint, so it counted them in evaluate."""
    assert soak.kill_stage([], committed={8, 16, 24}, store_stage="evaluate") == "start-up"
    assert soak.kill_stage(markers("evaluate"), committed={16, 24}, store_stage="evaluate") == "evaluate"


def test_the_last_marker_before_the_kill_names_its_stage(soak):
    run = markers("prepare", "validate", "train", "train-step", "train-step", "evaluate", "register")
    assert soak.kill_stage(run, set(), "prepare", at=100.5) == "prepare"
    assert soak.kill_stage(run, set(), "validate", at=101.2) == "validate"
    assert soak.kill_stage(run, set(), "train", at=103.9) == "train"  # a step's marker: the train stage
    assert soak.kill_stage(run, {16, 24}, "evaluate", at=105.1) == "evaluate"
    assert soak.kill_stage(run, {16, 24}, "done") == "register"  # at=None: after every marker


def test_a_synchronous_save_is_checkpoint_until_it_commits(soak):
    run = markers("train", *["train-step"] * 8, "checkpoint")
    assert soak.kill_stage(run, set(), "train") == "checkpoint"  # no file uploaded yet
    assert soak.kill_stage(run, set(), "checkpoint") == "checkpoint"
    assert soak.kill_stage(run, {8}, "train") == "train"  # committed: back in the steps, marked or not
    second = [*run, *markers(*["train-step"] * 8, "checkpoint", start=200.0)]
    assert soak.kill_stage(second, {8}, "checkpoint") == "checkpoint"  # the 2nd save: step 16


def test_a_kill_while_an_asynchronous_upload_runs_is_checkpoint_upload(soak):
    run = markers("train", *["train-step"] * 8, "checkpoint", "checkpoint-upload", "train-step", "train-step")
    assert soak.upload_open(run, set()) and not soak.upload_open(run, {8})
    assert soak.kill_stage(run, set(), "train") == "checkpoint-upload"  # steps go on, the upload too
    assert soak.kill_stage(run[:-2], set(), "checkpoint") == "checkpoint-upload"
    assert soak.kill_stage(run, {8}, "train") == "train"  # its commit marker is there: the upload ended
    assert soak.kill_stage(run[:-2], {8}, "train") == "train"
    assert soak.kill_stage(run[:-3], set(), "train") == "checkpoint"  # the save's synchronous part


def test_without_checkpoint_markers_the_store_tells_a_save(soak):
    """Training that writes no marker inside it yet: a save is seen as its files uploaded, uncommitted."""
    run = markers("prepare", "validate", "train")
    assert soak.kill_stage(run, set(), "checkpoint") == "checkpoint"
    assert soak.kill_stage(run, {8}, "train") == "train"


# -- the soak: where a kill is aimed ---------------------------------------------------------------


def test_windows_and_aims_follow_the_reference_markers(soak):
    run = markers("train", "train-step", "train-step", "checkpoint", "train-step", "train-step", "evaluate")
    assert soak.plain_steps(run) == [1, 3]  # the 2nd step is followed by its save
    assert soak.nth(run, "train-step", 3) == 4 and soak.nth(run, "train-step", 5) is None
    assert soak.window(run, 3) == 1.0  # until the next marker
    assert soak.window(run, 3, end=103.25) == pytest.approx(0.25)  # or the commit, if it came first
    assert soak.window(run, 3, end=105.5, bounded=False) == pytest.approx(2.5)  # an upload: its commit only
    assert soak.window(run, 6) == 0.0  # nothing after it, no end known
    aim = soak.MarkerAim("train-step", [3], [0.4])
    assert aim.fire_at(run[:4]) is None and aim.fire_at(run) == pytest.approx(104.4)


def test_an_aim_moves_on_when_its_window_closes_first(soak):
    """A save quicker than in the reference: the kill is aimed at the next one."""
    run = markers("train", "checkpoint", "checkpoint-upload", "checkpoint", "checkpoint-upload")
    upload = soak.MarkerAim("checkpoint-upload", [1, 2], [1.5, 1.5], until_commit=True)
    assert not upload.closed(run[:4], committed=set())  # steps go on: later markers do not close it
    assert upload.closed(run[:4], committed={8})  # its commit does
    assert upload.move_on() and upload.occurrences == [2] and upload.fire_at(run) == pytest.approx(105.5)
    assert not upload.move_on() and upload.occurrences == [2]  # the last: kept, fired when due
    sync = soak.MarkerAim("checkpoint", [1], [0.5])
    assert not sync.closed(run[:2], set()) and sync.closed(run[:3], set())  # its upload began: the save's sync part ended


def test_goodput_summary(soak):
    out = soak.goodput_summary(0.8, [0.76, 0.6, 0.78])
    assert out["goodput_reference"] == 0.8
    assert out["goodput_under_kills"] == {"median": 0.76, "min": 0.6, "trials": 3}
    assert out["ratios"] == {"goodput_vs_reference": 0.95}
    assert out["spread"] == {"goodput_vs_reference": [0.75, 0.975]}
    assert out["goal"]["met"] is True and "goodput_note" not in out
    assert soak.goodput_summary(0.8, [0.5])["goal"]["met"] is False
    missing = soak.goodput_summary(None, [], "runs.ledger cannot be imported")
    assert missing["goodput_reference"] is None and missing["goodput_under_kills"] is None
    assert missing["ratios"] == {"goodput_vs_reference": None} and missing["goal"]["met"] is None
    assert missing["goodput_note"] == "runs.ledger cannot be imported"


def test_a_nodes_own_save_is_no_store_save_and_short_stages_are_topped_up(soak):
    """A save kept on the node only (``checkpoint-node``) counts in no store save's number: the kill after the
    store's 2nd save is still that save's; a stage where fewer rank kills landed than asked is aimed at again, and
    the goal wants as many in every stage."""
    node = markers("checkpoint-node", start=150.0)
    run = [*markers("train", *["train-step"] * 8, "checkpoint"), *node, *markers(*["train-step"] * 8, "checkpoint", start=200.0)]
    assert soak.kill_stage(run, {8}, "checkpoint") == "checkpoint"
    assert soak.kill_stage(run, {8, 16}, "train") == "train"  # the 2nd store save (step 16) committed, not a 3rd
    assert soak.kill_stage(run[:11], {8}, "train") == "checkpoint-node"  # its own stage, apart from the store's saves
    trials = [soak.Trial(number=i, stage=s, fault="kill", kind="rank") for i, s in enumerate(["train", "checkpoint"], 1)]
    for trial, landed in zip(trials, ["train", "train"], strict=True):
        trial.landed = landed
    assert soak.short_stage(trials, ("train", "checkpoint", "checkpoint-upload"), 2) == "checkpoint"
    assert soak.short_stage(trials, ("train",), 2) is None and soak.short_stage(trials, ("train", "checkpoint"), 0) is None
    stage = {"trials": 2, "goodput_vs_reference": 0.95, "lost_per_kill_s": {"restart": 4.0}}
    rank = {"by_stage": dict.fromkeys(soak.GOODPUT_STAGES, stage)}
    assert soak.rank_goal(rank, 2)["met"] is True and soak.rank_goal(rank, 3)["met"] is False
