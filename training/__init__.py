"""GPT pretraining on megatron-core: the Trainer (train.py), the model, loading, checkpoints, run
bookkeeping, observers. No Flyte here."""
