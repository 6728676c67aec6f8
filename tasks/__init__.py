"""Thin Flyte tasks: each turns its config section into library calls and returns a typed record."""

from tasks import schemas

schemas.install()
