"""Hugging Face checkpoints in and out: import (Llama, Mistral, Qwen2, Qwen3), export of the same family."""
