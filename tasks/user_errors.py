"""A task's user errors reach the person as their message, not as a traceback of our code; a task that ends
says so, with its time (``tasks.stage_log``)."""

from __future__ import annotations

import functools
import time
from collections.abc import Callable
from typing import TypeVar

from common.errors import TRACEBACK_LABEL, UserError, traceback_note, write_traceback
from tasks import stage_log

F = TypeVar("F", bound=Callable)


def as_messages(fn: F) -> F:
    """Wrap a task function (under ``@task``): a UserError it raises loses its traceback of our
    frames, which goes to a log file instead, so ``pyflyte run`` prints the message and where the
    traceback is. Other exceptions keep their traceback: those are ours to fix. A body that returns
    prints its stage line (``tasks.stage_log``)."""

    @functools.wraps(fn)
    def run(*args, **kwargs):
        started = time.perf_counter()
        try:
            with stage_log.entered():
                out = fn(*args, **kwargs)
                stage_log.finished(fn.__name__, time.perf_counter() - started)
        except UserError as e:
            if e.args and isinstance(e.args[0], str) and TRACEBACK_LABEL in e.args[0]:
                # Raised by a task this one ran (a dynamic workflow's): it already says where its traceback is.
                raise e.with_traceback(None) from None
            log = write_traceback(e, fn.__name__)
            if log and e.args and isinstance(e.args[0], str):  # the message travels; Flyte copies exceptions by it
                e.args = (f"{e.args[0]}\n{traceback_note(log)}", *e.args[1:])
            raise e.with_traceback(None) from None
        return out

    return run  # type: ignore[return-value]
