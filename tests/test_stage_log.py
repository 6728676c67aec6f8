"""Stage lines (issue 51): each task's body says when it ended and how long it took, nested under the dynamic
workflow that ran it; the summary's line names the tasks that ran and those of the cached ones that did not."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from common.errors import UserError
from tasks import stage_log
from tasks.user_errors import as_messages


@pytest.fixture
def execution(monkeypatch):
    """A local execution's stage log, removed after."""
    monkeypatch.delenv(stage_log.ENV, raising=False)
    monkeypatch.delenv("RANK", raising=False)
    stage_log.begin(local=True)
    path = Path(os.environ[stage_log.ENV])
    yield path
    stage_log.end()
    assert not path.exists() and stage_log.ENV not in os.environ


@as_messages
def scan_partition() -> None:  # a map task of the data stage: two levels down
    pass


@as_messages
def prepare_data() -> str:
    scan_partition()
    return "dataset"


@as_messages
def prepare_mixture() -> str:
    return prepare_data()


@as_messages
def check_settings() -> None:
    raise UserError("data.sources: nothing there")


def test_each_task_says_its_time_nested_under_the_dynamic_workflow_that_ran_it(execution, capsys):
    assert prepare_mixture() == "dataset"
    lines = capsys.readouterr().out.splitlines()
    assert [line.split(":")[0] for line in lines] == ["  stage prepare_data", "stage prepare_mixture"], lines
    assert all(line.endswith(" s") for line in lines)
    assert [(task, depth) for task, _, depth in stage_log.ran()] == [("prepare_data", 2), ("prepare_mixture", 1)]  # no map task
    with pytest.raises(UserError):
        check_settings()  # a failed body ends with its error, not a stage line
    assert "check_settings" not in capsys.readouterr().out


def test_the_summary_names_what_ran_and_which_cached_tasks_did_not(execution):
    with stage_log.entered():
        stage_log.finished("check_settings", 0.01)
    with stage_log.entered():  # a dynamic workflow: its tasks' time is inside its own
        for seconds in (2.0, 1.5):
            with stage_log.entered():
                stage_log.finished("prepare_data", seconds)
        stage_log.finished("prepare_mixture", 3.75)
    with stage_log.entered():
        stage_log.finished("train_model", 12.25)
    cached = ["prepare_data", "validate_data", "train_model", "evaluate_model", "register_model"]
    line = stage_log.stages_line(stage_log.ran(), cached)
    assert line == (
        "  stages      ran: prepare_mixture 3.8 s, train_model 12.2 s, 1 more under 0.5 s; "
        "from cache: validate_data, evaluate_model, register_model"
    )


def test_only_rank_zero_and_only_local_executions_keep_a_log(execution, monkeypatch, capsys):
    monkeypatch.setenv("RANK", "1")
    with stage_log.entered():
        stage_log.finished("train_model", 3.0)
    assert capsys.readouterr().out == "" and stage_log.ran() == []
    monkeypatch.setenv("RANK", "0")
    with stage_log.entered():
        stage_log.finished("train_model", 3.0)
    assert stage_log.ran() == [("train_model", 3.0, 1)]
    stage_log.begin(local=False)  # a cluster's execution: every task a pod of its own, the console shows them
    assert not execution.exists() and stage_log.ran() == [] and stage_log.stages_line(stage_log.ran(), ["train_model"]) == ""
