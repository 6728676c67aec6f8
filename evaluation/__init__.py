"""Evaluation of a trained checkpoint: held-out loss and bits per byte, samples, lm-eval suites on the
Hugging Face export. No Flyte here."""
