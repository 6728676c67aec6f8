"""The one rule for registry model names and aliases, shared by the config checks and the registry.

A name or an alias becomes one folder or file name of a store key (``models/<name>/<version>/``,
``models/<name>/aliases/<alias>.json``), so the pattern admits only what cannot leave its
folder or collide with the store's own names: 1-64 letters, digits, ``.``, ``_`` or ``-``,
starting with a letter or digit. That rules out ``/``, ``..``, empty names, whitespace and
control characters, and names of the store's markers (``_COMMITTED``, ``_CLAIMED``) or its
temporary files (``.tmp-…``). An alias is not all digits either: ``NAME:3`` means version 3.
"""

from __future__ import annotations

import re

NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")
"""Registry model names and aliases (an alias is not all digits: those are version numbers)."""
VERSION = re.compile(r"[1-9][0-9]{0,17}")
"""A version number as a spec writes it (``NAME:3``): ASCII digits, no leading zero."""
RULE = "1-64 letters, digits, '.', '_' or '-', starting with a letter or digit"


def name_problem(value: object, *, alias: bool = False) -> str:
    """Why ``value`` cannot be a model name (or, with ``alias``, an alias), or '' if it can.

    The text follows ``<what> is <value>: `` in a message."""
    what = "an alias" if alias else "a name"
    if not isinstance(value, str) or not NAME.fullmatch(value):
        return f"use {what} of {RULE}"
    if alias and value.isdigit():
        return f"an alias cannot be all digits (NAME:{value} means version {value})"
    return ""


def spec_problem(spec: object) -> str:
    """Why ``spec`` is not ``NAME``, ``NAME:VERSION`` or ``NAME:ALIAS``, or '' if it is."""
    if not isinstance(spec, str):
        return f"{spec!r} is not a string"
    name, colon, which = spec.partition(":")
    problem = name_problem(name)
    if problem:
        return f"model name {name!r}: {problem}"
    if colon and not VERSION.fullmatch(which):
        problem = name_problem(which, alias=True)
        if problem:
            return f"{which!r} is neither a version number (1, 2, ...) nor an alias: {problem}"
    return ""
