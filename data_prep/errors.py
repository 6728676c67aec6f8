"""The error of bad input data, in a module of its own: the training side raises it too (a shard or manifest
that fails its checks), and importing it must not bring the corpus listing (``data_prep.sources``) into the
train task's cache key."""

from __future__ import annotations

from common.errors import UserError


class DataError(UserError, ValueError):
    """Bad input the user must fix: the message names the source and the remedy."""
