"""Checkpoints: the format and its integrity checks, the manager the training loop uses, local staging."""
