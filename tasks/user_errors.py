"""A task's user errors reach the person as their message, not as a traceback of our code."""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import TypeVar

from common.errors import TRACEBACK_LABEL, UserError, traceback_note, write_traceback

F = TypeVar("F", bound=Callable)


def as_messages(fn: F) -> F:
    """Wrap a task function (under ``@task``): a UserError it raises loses its traceback of our
    frames, which goes to a log file instead, so ``pyflyte run`` prints the message and where the
    traceback is. Other exceptions keep their traceback: those are ours to fix."""

    @functools.wraps(fn)
    def run(*args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except UserError as e:
            if e.args and isinstance(e.args[0], str) and TRACEBACK_LABEL in e.args[0]:
                # Raised by a task this one ran (a dynamic workflow's): it already says where its traceback is.
                raise e.with_traceback(None) from None
            log = write_traceback(e, fn.__name__)
            if log and e.args and isinstance(e.args[0], str):  # the message travels; Flyte copies exceptions by it
                e.args = (f"{e.args[0]}\n{traceback_note(log)}", *e.args[1:])
            raise e.with_traceback(None) from None

    return run  # type: ignore[return-value]
