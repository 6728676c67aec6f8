"""Stage lines: each task says when it is done and how long it took; the last task says which came from cache.

Flyte's console shows every node of an execution with its time and cache state; a local execution
(``pretrain run``, ``pyflyte run``) shows nothing of the kind, and a cached task runs no code of ours at
all. So each task's body (``as_messages`` wraps them all) ends with one line, ``stage <task>: <s> s``,
indented under the dynamic workflow that ran it (``prepare_mixture`` → ``prepare_data``; the data stage's
own map tasks, a level deeper, are left out: a corpus has many partitions), and appends its name and time
to this execution's stage log: a file ``begin`` (the workflow's first
node) names in ``$PRETRAIN_STAGE_LOG``, which the train task's ranks inherit. ``track_run`` (the last
node) reads it back: the tasks that ran, with their times, and those of the pipeline's cached tasks
that did not: their outputs came from the cache.

Local executions only: on a cluster every task is a pod of its own (no shared file) and the console
shows the same. Of the ranks, rank 0 alone writes.
"""

from __future__ import annotations

import json
import os
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

ENV = "PRETRAIN_STAGE_LOG"
SHOWN_DEPTH = 2
"""Tasks nested deeper than this (a dynamic workflow's inside another's) have no line."""
BRIEF_S = 0.5
"""The summary counts the tasks that took less, without naming them (their own lines did)."""
LAST_WORD = "track_run"
"""The task whose output ends the execution (the summary): its own stage line would follow it."""
_depth = [0]
"""How many task bodies this process is inside now: a local dynamic workflow runs its tasks inside its own."""


def begin(local: bool) -> None:
    """A new execution's stage log (``local``: a local execution; elsewhere there is none)."""
    end()  # an earlier execution's in this process (tests, notebooks), if it failed before its summary
    if not local:
        return
    fd, path = tempfile.mkstemp(prefix="pretrain-stages-", suffix=".jsonl")
    os.close(fd)
    os.environ[ENV] = path


@contextmanager
def entered() -> Iterator[None]:
    """Around a task's body: the tasks it runs are nested a level deeper."""
    _depth[0] += 1
    try:
        yield
    finally:
        _depth[0] -= 1


def end() -> None:
    """The execution's log read for the last time (its summary printed, or it failed): removed."""
    path = os.environ.pop(ENV, None)
    if path:
        Path(path).unlink(missing_ok=True)


def finished(task: str, seconds: float) -> None:
    """One task's body ended (inside ``entered``): its stage line, and its entry in the execution's log
    (rank 0 only; none for a task nested deeper than ``SHOWN_DEPTH``)."""
    depth = _depth[0]
    if os.environ.get("RANK", "0") != "0" or depth > SHOWN_DEPTH or task == LAST_WORD:
        return
    print(f"{'  ' * (depth - 1)}stage {task}: {seconds:,.1f} s", flush=True)
    path = os.environ.get(ENV)
    if not path:
        return
    try:
        with open(path, "a", encoding="utf-8") as log:
            log.write(json.dumps({"task": task, "seconds": round(seconds, 3), "depth": depth, "at": time.time()}) + "\n")
    except OSError:  # a view of the execution: never worth a task
        pass


def ran() -> list[tuple[str, float, int]]:
    """The tasks of this execution that ran so far, in the order they ended: (task, seconds, depth; 1 = the
    workflow's own, 2 = one a dynamic workflow ran, whose time its own holds)."""
    path = os.environ.get(ENV)
    if not path or not os.path.exists(path):
        return []
    rows = [json.loads(line) for line in Path(path).read_text(encoding="utf-8").splitlines() if line.strip()]
    return [(row["task"], float(row["seconds"]), int(row.get("depth", 1))) for row in rows]


def stages_line(done: list[tuple[str, float, int]], expected_cached: list[str]) -> str:
    """``stages  ran: a 0.1 s, b 12.0 s; from cache: c, d``: of ``done`` (``ran()``), the workflow's own tasks
    with their times, and the tasks of ``expected_cached`` (the cached tasks this execution called, at any depth)
    that did not run."""
    if not done:
        return ""
    top = [(task, seconds) for task, seconds, depth in done if depth == 1]
    long = [(task, seconds) for task, seconds in top if seconds >= BRIEF_S]
    parts = [f"{task} {seconds:,.1f} s" for task, seconds in long]
    if len(long) < len(top):
        parts.append(f"{len(top) - len(long)} more under {BRIEF_S} s")
    names = {task for task, _, _ in done}
    cached = [name for name in dict.fromkeys(expected_cached) if name not in names]
    return "  stages      ran: " + ", ".join(parts) + (f"; from cache: {', '.join(cached)}" if cached else "")
