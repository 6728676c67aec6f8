"""Thin Flyte tasks: each turns its config section into library calls and returns a typed record."""
