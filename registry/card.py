"""The model card: read back through ``common.contracts.ModelCard``, written as markdown, and the code
revision and time a registration records."""

from __future__ import annotations

import dataclasses
import datetime as dt
import subprocess
from pathlib import Path
from typing import Any

from common.contracts import (
    CardFormatError,
    CodeRevision,
    ModelCard,
    card_key,
)
from common.errors import ConfigError
from evaluation.lm_eval_catalog import chance_level
from registry.names import RegistryError
from storage import Store


def utc_now() -> str:
    return dt.datetime.now(dt.UTC).isoformat(timespec="seconds")


def code_revision() -> CodeRevision:
    """The git commit of the project and whether its tree had uncommitted changes."""
    root = Path(__file__).resolve().parent.parent
    try:
        commit = subprocess.run(["git", "rev-parse", "HEAD"], cwd=root, capture_output=True, text=True, check=True).stdout.strip()
        dirty = bool(subprocess.run(["git", "status", "--porcelain"], cwd=root, capture_output=True, text=True).stdout.strip())
        return CodeRevision(commit=commit, dirty=dirty)
    except (OSError, subprocess.CalledProcessError):
        return CodeRevision()


def read_card(store: Store, entry: str) -> ModelCard:
    """The card of the registry entry at key prefix ``entry``."""
    try:
        return ModelCard.from_dict(store.get_json(card_key(entry)))
    except CardFormatError as e:
        raise RegistryError(f"{store.url(card_key(entry))}: {e}; register the model again with this release") from e


def check_continuable(store: Store, entry: str, model: dict[str, Any]) -> None:
    """Refuse, before any work, to continue ``entry`` with another model section."""
    problem = read_card(store, entry).continuation_problem(model)
    if problem:
        raise ConfigError(problem)


COUNTS = frozenset({"parameters", "tokens_trained", "world_size", "val_tokens"})
"""Card metrics that are counts: the training summary carries them as floats (its Flyte type), shown as integers."""


def metric_text(key: str, value: object) -> str:
    """A card metric as a person reads it: a count as an integer, any other figure to 4 decimals, an
    lm-eval accuracy with the score of guessing beside it."""
    if isinstance(value, int) and not isinstance(value, bool):
        return str(value)
    if not isinstance(value, float):
        return str(value)
    if key in COUNTS and value.is_integer():
        return str(int(value))
    chance = chance_level(key)
    if chance is None:
        return f"{value:.4f}"
    return f"{value:.4f} (chance {chance:.2f})" if chance else f"{value:.4f} (chance ≈ 0)"


def card_markdown(card: ModelCard) -> str:
    lines = [
        f"# {card.name} v{card.version}",
        "",
        f"Registered {card.registered_at} from commit `{card.code.commit}`" + (" (dirty tree)" if card.code.dirty else ""),
        "",
        "## Metrics",
        *[f"- {k}: {metric_text(k, v)}" for k, v in sorted(card.metrics.items())],
        "",
        "## Trained by",
        *([f"- {span.describe()}" for span in card.layouts] or ["- not recorded"]),
        "",
        "## Lineage",
        *[f"- {k}: {v}" for k, v in sorted(dataclasses.asdict(card.lineage).items()) if v != ""],
    ]
    if card.gate is not None:
        lines += ["", "## Quality gate", f"`{card.gate.alias}`: {card.gate.reason}"]
    lines += [
        "",
        "## Samples",
        "Greedy:",
        "```",
        card.sample,
        "```",
        "Sampled:",
        "```",
        card.sampled,
        "```",
    ]
    if card.hf_export:
        lines += [
            "",
            "## Hugging Face",
            f"`{card.hf_export}/` holds safetensors weights, a Llama `config.json` and the tokenizer.",
            f"After `pretrain registry download {card.name}:{card.version} DEST`:",
            "```python",
            "from transformers import AutoModelForCausalLM, AutoTokenizer",
            f'model = AutoModelForCausalLM.from_pretrained("DEST/{card.hf_export}")',
            f'tokenizer = AutoTokenizer.from_pretrained("DEST/{card.hf_export}")',
            "```",
        ]
    return "\n".join(lines) + "\n"
