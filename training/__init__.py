"""GPT pretraining on megatron-core: model, data loading, loop, checkpoints, evaluation. No Flyte here."""
