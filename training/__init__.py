"""GPT pretraining on megatron-core: the Trainer (train.py), the model, loading, checkpoints, run
bookkeeping, observers. No Flyte here."""

from training import known_warnings

known_warnings.install()  # before any module of ours imports megatron-core: its import-time warnings included
