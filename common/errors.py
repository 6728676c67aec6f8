"""The one base class of errors a user can fix, so that a command catches them all without
importing the libraries (and torch) that raise them."""

from __future__ import annotations

import difflib
import errno
import os
import re
import tempfile
import time
import traceback
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path

from common.private import private_dir, write_private

TRACEBACK_LABEL = "(full traceback: "


class UserError(Exception):
    """A problem the user can fix: a setting, an input file or record, a name, a credential.

    The message names what is wrong and what to do; commands print it as one line
    (``error: …``) and exit with status 2, with no traceback.
    """


class ConfigError(UserError, ValueError):
    """A setting, or a combination of settings, that cannot work; the message names the key(s)."""


class NoSpaceError(UserError):
    """A disk or a quota filled up mid-write; the message names the folder or store and what was
    being written. What was left half-written was removed, and nothing partial was committed."""


NO_SPACE_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT})
"""A full filesystem, or the user's quota on it: the same remedy either way."""


FLYTE_PREAMBLE = re.compile(r"Error encountered while executing '(?P<task>[^']+)':\s*")
"""How Flyte opens a task's error message (local execution rewrites the exception's in place), once per level:
a task of a dynamic workflow is named inside the preamble of the workflow's task."""
FLYTE_CODE = re.compile(r"(?:(?:USER|SYSTEM):\w+|\w*FlyteException): error=")
"""How Flyte's exceptions open theirs: the error code ("USER:ValueError: error=…"), once per wrapper."""


def peel_flyte(text: str) -> tuple[list[str], str]:
    """Flyte's preambles and error codes taken off the start of an error message: the tasks the preambles
    name, outermost first, by their short names (``prepare_data``), and the message that follows."""
    tasks: list[str] = []
    while match := FLYTE_PREAMBLE.match(text) or FLYTE_CODE.match(text):
        if match.re is FLYTE_PREAMBLE:
            tasks.append(match["task"].rsplit(".", 1)[-1])
        text = text[match.end() :]
    return tasks, text


def did_you_mean(word: str, choices: Iterable[str]) -> str:
    """`` (did you mean X?)`` for the one of ``choices`` a mistyped ``word`` begins or is closest to; '' when none is."""
    choices = sorted(choices)
    close = [c for c in choices if word and c.startswith(word)] or difflib.get_close_matches(word, choices, n=1, cutoff=0.6)
    return f" (did you mean {close[0]}?)" if close else ""


def first_line(error: BaseException) -> str:
    """The first line of ``error``'s message, or its type's name when it has none: for one-line reports."""
    text = str(error).strip()
    return text.splitlines()[0] if text else type(error).__name__


def is_no_space(error: BaseException) -> bool:
    """Whether ``error`` is an OSError saying a disk or quota is full."""
    return isinstance(error, OSError) and error.errno in NO_SPACE_ERRNOS


def _chain(error: BaseException) -> Iterator[BaseException]:
    """``error``, then its causes and contexts, outermost first (each once)."""
    seen: set[int] = set()
    current: BaseException | None = error
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        yield current
        current = current.__cause__ or current.__context__


def _staging_advice(folder: str | Path) -> str:
    advice = "free space there"
    if Path(folder).resolve().is_relative_to(Path(tempfile.gettempdir()).resolve()):
        advice += " or set TMPDIR to a folder with more space (staging goes there)"
    return advice


def no_space_message(folder: str | Path, error: OSError, what: str) -> str:
    """One line: which local ``folder`` is full, while writing ``what``, and what to do."""
    reason = (error.strerror or "no space left").lower()
    advice = _staging_advice(folder)
    return (
        f"local folder {folder} is full ({reason}) while writing {what}: {advice}, then run again; nothing partial was committed"
    )


def local_no_space(error: OSError, folder: str | Path | None = None, what: str = "") -> NoSpaceError:
    """A NoSpaceError for ``error`` (ENOSPC or EDQUOT), naming ``folder`` (else the folder of the
    file the error names) and ``what`` (else that file)."""
    path = error.filename2 or error.filename  # a copy names its destination second
    path = os.fsdecode(path) if isinstance(path, str | bytes) else ""
    if folder or path:
        return NoSpaceError(no_space_message(folder or os.path.dirname(path), error, what or path))
    # A write through a file object names no file: say where staging goes, the likeliest place.
    reason = (error.strerror or "no space left").lower()
    tmp = tempfile.gettempdir()
    return NoSpaceError(
        f"a local disk is full ({reason}) while writing a file (which one: see the traceback); local staging goes "
        f"to {tmp}: free space there or set TMPDIR to a folder with more space, then run again; nothing partial was committed"
    )


@contextmanager
def local_space(folder: str | Path, what: str) -> Iterator[None]:
    """Writes to a local ``folder`` (staging outside the store): a full disk there becomes one
    NoSpaceError naming the folder and ``what``; every other error passes unchanged."""
    try:
        yield
    except OSError as e:
        if not is_no_space(e):
            raise
        raise local_no_space(e, folder, what) from e


def user_error_in(error: BaseException) -> UserError | None:
    """The deepest UserError along ``error``'s chain of causes and contexts, or None.

    Flyte re-raises a task's exception wrapped, or as a copy whose message it prefixes
    ("Failed to convert outputs of task …"); the deepest one carries the user's words.
    A full disk that no layer named (an ENOSPC OSError from a library writing a local file)
    counts as one: a NoSpaceError naming the file's folder."""
    found = None
    for current in _chain(error):
        if isinstance(current, UserError):
            found = current
    if found is None:
        full = next((e for e in _chain(error) if is_no_space(e)), None)
        if full is not None:
            found = local_no_space(full)  # type: ignore[arg-type]
    return found


def log_dir() -> Path:
    """Where full tracebacks go: ``$PRETRAIN_LOG_DIR``, else ``$XDG_STATE_HOME/pretrain/logs``."""
    if os.environ.get("PRETRAIN_LOG_DIR"):
        return Path(os.environ["PRETRAIN_LOG_DIR"])
    state_home = os.environ.get("XDG_STATE_HOME") or os.path.join(Path.home(), ".local", "state")
    return Path(state_home) / "pretrain" / "logs"


def write_traceback(error: BaseException, what: str) -> Path | None:
    """``error``'s whole chained traceback in a new log file named after ``what``; None if none can be written."""
    try:
        folder = private_dir(log_dir(), "pretrain's logs")  # tracebacks hold paths, settings, values
        stamp = time.strftime("%Y%m%d-%H%M%S", time.gmtime())
        path = folder / f"{what}-{stamp}-{os.getpid()}.log"
        write_private(path, "".join(traceback.format_exception(error)).encode())
        return path
    except OSError:
        return None


def traceback_note(path: Path) -> str:
    """What a message says of where its traceback went."""
    return f"{TRACEBACK_LABEL}{path})"
