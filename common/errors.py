"""The one base class of errors a user can fix, so that a command catches them all without
importing the libraries (and torch) that raise them."""

from __future__ import annotations


class UserError(Exception):
    """A problem the user can fix: a setting, an input file or record, a name, a credential.

    The message names what is wrong and what to do; commands print it as one line
    (``error: …``) and exit with status 2, with no traceback.
    """


class ConfigError(UserError, ValueError):
    """A setting, or a combination of settings, that cannot work; the message names the key(s)."""


def user_error_in(error: BaseException) -> UserError | None:
    """The first UserError along ``error``'s chain of causes, outermost first, or None.

    Flyte re-raises a task's exception wrapped, or as a copy whose message it prefixes
    ("Failed to convert outputs of task …"); the deepest one carries the user's words."""
    found, seen = None, set()
    current: BaseException | None = error
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        if isinstance(current, UserError):
            found = current
        current = current.__cause__ or current.__context__
    return found
