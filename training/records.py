"""The records the training stages hand to each other: small, typed, torch-free.

Flyte passes them between tasks (and caches on them); they point into the store.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from data_prep.prepare import DatasetRef


@dataclass
class CheckpointRef:
    """A committed checkpoint in the store and what produced it."""

    store: str
    """Store URI."""
    run: str
    """Key prefix of the training run (``runs/<id>``)."""
    prefix: str
    """Key prefix of the committed checkpoint."""
    step: int
    """Optimizer steps done."""
    dataset: DatasetRef
    """The dataset it was trained on."""
    base_model: str = ""
    """Registry entry whose weights started the run ('' = trained from scratch)."""
    summary: dict[str, float] = field(default_factory=dict)
    """Final loss, throughput and size figures."""


@dataclass
class EvalReport:
    """Held-out results of one checkpoint."""

    checkpoint: CheckpointRef
    """The checkpoint evaluated."""
    val_loss: float
    """Mean next-token cross-entropy on the validation split (nats)."""
    perplexity: float
    """exp(val_loss)."""
    tokens_evaluated: int
    """Validation tokens scored."""
    bits_per_byte: float
    """Validation loss in bits per UTF-8 byte of text: comparable across tokenizers."""
    sample: str
    """Greedy continuation of the configured prompt."""
    sampled: str = ""
    """Seeded, temperature-sampled continuation of the prompt."""
    baseline: str = ""
    """Registry entry the candidate was compared with ('' = none registered under the gate alias)."""
    baseline_bits_per_byte: float = -1.0
    """The baseline's bits per byte on the same validation rows (-1: none, or not comparable)."""
    outputs: str = ""
    """Key prefix of the committed evaluation files: ``results.json`` and the Hugging Face export ``hf/``."""
