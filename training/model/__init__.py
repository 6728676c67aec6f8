"""The GPT on megatron-core: the model, its layers, the train step. Imports torch and megatron."""
