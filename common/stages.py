"""Stage markers: where a pipeline's process is, as it goes, for whoever breaks it on purpose.

When ``$PRETRAIN_STAGE_MARKERS`` names a file, ``mark_stage(name)`` appends one line
``<name> <time.time()> <pid>`` to it as a stage's own work begins (the pid: the process to kill for a
fault of that one process, a rank): one ``open(O_APPEND)``, one
``write``, one ``close`` (a few µs; every process of the pipeline, ranks included, inherits the
variable). Unset, it does nothing. A marker never breaks the work it marks: an ``OSError``
(a full disk, a removed folder) is ignored.

The soak (``benchmarks/soak.py``) aims its kills at these lines and counts where each landed by the
last one written before it. The names it knows (``NAMES``):

- ``prepare``, ``validate``, ``train``, ``evaluate``, ``register``: a task's body starts
  (``tasks/``: prepare_data, validate_data, train_model, evaluate_model, register_model);
- ``train-step``: a training step starts; ``checkpoint``: the synchronous part of a checkpoint
  save starts (steps wait); ``checkpoint-upload``: a save's asynchronous upload starts (steps go on
  while it runs, until the save's commit marker is in the store); ``checkpoint-node``: the synchronous part of a
  save to this node's disk only starts (``train.local_checkpoint_every``: no upload, no commit in the store).

One line per event: a marker that every rank would write is written by one process (rank 0), so that
the n-th line of a name is the n-th event.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from pathlib import Path

ENV = "PRETRAIN_STAGE_MARKERS"
NAMES = (
    "prepare",
    "validate",
    "train",
    "train-step",
    "checkpoint",
    "checkpoint-upload",
    "checkpoint-node",
    "evaluate",
    "register",
)


def mark_stage(name: str) -> None:
    """Append ``<name> <time.time()>`` to the file ``$PRETRAIN_STAGE_MARKERS`` names; nothing when it is unset.

    A name with white space is refused (ValueError, whether or not markers are on: a programming
    error, found by any test); an ``OSError`` writing the line is ignored."""
    if not name or any(c.isspace() for c in name):
        raise ValueError(f"a stage marker's name is one word, not {name!r}")
    path = os.environ.get(ENV)
    if not path:
        return
    line = f"{name} {time.time():.6f} {os.getpid()}\n".encode()
    try:
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o600)
        try:
            os.write(fd, line)  # one unbuffered write of one short line: appended whole
        finally:
            os.close(fd)
    except OSError:
        pass


@dataclass(frozen=True)
class Marker:
    name: str
    at: float  # time.time() when it was written
    pid: int = 0  # the process that wrote it (0: a line of an earlier release, without one)


def parse_markers(text: str) -> list[Marker]:
    """The markers of a file's ``text``, in order; a line being written (no newline yet) or malformed is skipped."""
    found: list[Marker] = []
    for line in text.split("\n")[:-1]:  # the last piece has no newline yet: being written, or ''
        name, _, rest = line.partition(" ")
        at, _, pid = rest.partition(" ")
        if not name:
            continue
        try:
            found.append(Marker(name, float(at), int(pid) if pid else 0))
        except ValueError:
            continue
    return found


def read_markers(path: Path) -> list[Marker]:
    """The markers in ``path`` (none when it is not there yet)."""
    try:
        return parse_markers(path.read_text(errors="replace"))
    except FileNotFoundError:
        return []
