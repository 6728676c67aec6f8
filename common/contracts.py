"""What flows between the stages, and where it lives in the store. Torch-free, Flyte-free.

    prepare ─▶ DatasetRef ─▶ validate ─▶ DatasetRef ─▶ train ─▶ CheckpointRef ─▶ evaluate ─▶ EvalReport ─▶ register ─▶ ModelRef

Flyte passes these records between tasks and caches on them; each points into the store,
whose layout is spelled out once, by the key functions below:

    datasets/<version>/                    manifest.json, tokenizer.json, doc_stats.csv, shards/, _COMMITTED
    datasets/<version>/validation/         result.json, report.html, site/, _COMMITTED
    runs/<run>/checkpoints/step-NNNNNNN/   model/, rng/, meta.json, metrics.jsonl, _COMMITTED
    runs/<run>/metrics.jsonl, tensorboard/
    runs/<run>/eval/<key>/                 results.json, hf/, _COMMITTED
    models/<name>/<version>/               card.json, card.md, checkpoint/, tokenizer.json, evaluation.json, hf/, _COMMITTED
    models/<name>/aliases/<alias>.json

A prefix counts only once its ``_COMMITTED`` marker exists (``storage``).
"""

from __future__ import annotations

from dataclasses import dataclass, field

# -- file names inside a prefix ---------------------------------------------------------
MANIFEST = "manifest.json"
TOKENIZER = "tokenizer.json"
DOC_STATS = "doc_stats.csv"
CHECKPOINT_META = "meta.json"
METRICS = "metrics.jsonl"
EVAL_RESULTS = "results.json"
HF_EXPORT = "hf"
CARD = "card.json"
CARD_MARKDOWN = "card.md"


# -- store keys ---------------------------------------------------------------------------
def dataset_prefix(version: str) -> str:
    return f"datasets/{version}"


def validation_prefix(dataset: str) -> str:
    """The validation outputs of the dataset at key prefix ``dataset``."""
    return f"{dataset}/validation"


def run_prefix(run_id: str) -> str:
    return f"runs/{run_id}"


def checkpoints_prefix(run: str) -> str:
    """The folder of a run's checkpoints; ``run`` is the run's key prefix."""
    return f"{run}/checkpoints"


def checkpoint_prefix(run: str, step: int) -> str:
    return f"{checkpoints_prefix(run)}/step-{step:07d}"


def step_of_checkpoint(name: str) -> int | None:
    """The step of a checkpoint folder's name (``step-0000300`` → 300), or None for another name."""
    digits = name.removeprefix("step-")
    return int(digits) if name.startswith("step-") and digits.isdigit() else None


def metrics_key(run: str) -> str:
    return f"{run}/{METRICS}"


def eval_prefix(run: str, key: str) -> str:
    return f"{run}/eval/{key}"


MODELS = "models"


def model_root(name: str) -> str:
    return f"{MODELS}/{name}"


def model_prefix(name: str, version: int) -> str:
    return f"{model_root(name)}/{version}"


def aliases_prefix(name: str) -> str:
    return f"{model_root(name)}/aliases/"


def alias_key(name: str, alias: str) -> str:
    return f"{aliases_prefix(name)}{alias}.json"


# -- records passed between tasks ---------------------------------------------------------
@dataclass
class DatasetRef:
    """A committed dataset in the store: what later stages need to find and trust it."""

    store: str
    """Store URI the dataset lives in."""
    version: str
    """Content hash of the manifest."""
    prefix: str
    """Key prefix of the dataset inside the store (``datasets/<version>``)."""
    stats: dict[str, int] = field(default_factory=dict)
    """Document, token and skip counts."""


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


@dataclass
class ModelRef:
    """A committed registry entry."""

    store: str
    """Store URI."""
    name: str
    """Model name."""
    version: int
    """Version number within the name."""
    prefix: str
    """Key prefix of the entry (``models/<name>/<version>``)."""
