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
