"""Deliberately empty: kernels land with issue 5."""
