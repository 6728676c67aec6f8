"""Composition of the whole pipeline: config tree, versioning, the pretrain CLI."""
