"""The model card: read back through ``common.contracts.ModelCard``, written as markdown, and the code
revision and time a registration records.

The lineage names what a card points at in its own store by key (``runs/<id>/checkpoints/…``,
``datasets/<version>``), so a copied or moved store still reads: ``location_url`` makes the URL in the
store at hand. Cards registered before held absolute URLs; ``read_card`` turns those of the store the
card was registered in (this one, or the one it was copied from) back into keys."""

from __future__ import annotations

import dataclasses
import datetime as dt
import math
import subprocess
from pathlib import Path
from typing import Any

from common.contracts import (
    CardFormatError,
    CodeRevision,
    Lineage,
    ModelCard,
    card_key,
    checkpoint_prefix,
)
from common.errors import ConfigError
from evaluation.lm_eval_catalog import chance_level
from registry.names import RegistryError
from storage import Store
from storage.store import key_problem

LOCATIONS = ("dataset", "dataset_manifest", "checkpoint", "evaluation")
"""The lineage fields that name a place (the others are keys, versions and hashes already)."""


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
    """The card of the registry entry at key prefix ``entry``, its lineage in keys of ``store``."""
    try:
        card = ModelCard.from_dict(store.get_json(card_key(entry)))
    except CardFormatError as e:
        raise RegistryError(f"{store.url(card_key(entry))}: {e}; register the model again with this release") from e
    return dataclasses.replace(card, lineage=relative_lineage(store, card.lineage))


def is_url(location: str) -> bool:
    """Whether a lineage location is a URL or an absolute path (cards of before), not a key of the store."""
    return "://" in location or location.startswith("/")


def location_url(store: Store, location: str) -> str:
    """Where a lineage location is: a key's URL in ``store``, a URL as it is ('' stays '')."""
    return location if not location or is_url(location) else store.url(location)


def store_key(store: Store, url: str) -> str:
    """``url`` as a key of ``store`` when it lies in it (the key, checked), else ``url`` unchanged."""
    root = store.url("")
    key = url[len(root) :] if url.startswith(root) else ""
    return key if key and not key_problem(key) else url


def registered_root(lineage: Lineage) -> str:
    """The root URL of the store an old card was registered in ('' if it does not say): its checkpoint's
    URL less the checkpoint's key, which the card knows from its run and step."""
    key = checkpoint_prefix(lineage.training_run, lineage.training_steps)
    if is_url(lineage.checkpoint) and lineage.checkpoint.endswith(f"/{key}"):
        return lineage.checkpoint[: -len(key)]
    return ""


def relative_lineage(store: Store, lineage: Lineage) -> Lineage:
    """``lineage`` with every absolute location in ``store``, or in the store the card was registered in
    (a copy's old cards name the original), as a key; a location in some other store stays a URL."""
    old_root = registered_root(lineage)

    def key(location: str) -> str:
        if not is_url(location):
            return location
        if old_root and location.startswith(old_root) and not key_problem(location[len(old_root) :]):
            return location[len(old_root) :]
        return store_key(store, location)

    return dataclasses.replace(lineage, **{name: key(getattr(lineage, name)) for name in LOCATIONS})


def lineage_urls(store: Store, lineage: Lineage) -> dict[str, str]:
    """The URL in ``store`` of every location the lineage names (base model and training run too)."""
    named = {name: getattr(lineage, name) for name in (*LOCATIONS, "training_run", "base_model", "cooldown_from")}
    return {name: location_url(store, location) for name, location in named.items() if location}


def base_eod_token(store: Store, entry: str) -> str:
    """The token that ends a document in the tokenizer of registry ``entry`` ('' = ``<|endoftext|>``)."""
    return read_card(store, entry).lineage.eod_token


def continued_model(store: Store, entry: str, asked: dict[str, Any], defaults: dict[str, Any]) -> dict[str, Any]:
    """The model section of a run continuing registry ``entry``: the base's shape (an imported model's is its
    Hugging Face config's), with the run's ``kernels``. A setting the run changed from its default (``defaults``)
    must be the base's: one that is not is refused, naming each, before any work."""
    card = read_card(store, entry)
    base = card.model_config(defaults)
    conflicts = [k for k in sorted(asked) if k != "kernels" and asked[k] != defaults.get(k) and asked[k] != base.get(k)]
    if conflicts:
        details = ", ".join(f"model.{k}: {asked[k]!r} here, {base.get(k)!r} there" for k in conflicts)
        raise ConfigError(
            f"train.init_from names {card.name}:{card.version}, whose model section differs ({details}): a continued "
            "run keeps its base's shape; leave those settings out (they come from the base) or train from scratch "
            "(train.init_from: '')"
        )
    return {**base, "kernels": asked.get("kernels", base.get("kernels"))}


COUNTS = frozenset({"parameters", "steps_trained", "tokens_trained", "world_size", "val_tokens"})
"""Card metrics that are counts: the training summary carries them as floats (its Flyte type), shown as integers."""
EVALUATED = frozenset({"val_loss", "perplexity", "bits_per_byte", "lm_eval"})
"""The evaluation's figures (also ``base.<figure>``, ``<figure>.<component>``, ``lm_eval.<task>.<metric>``): to 4
decimals whatever their size, the precision models are compared at (the gate's reasons, the run's summary)."""


def metric_text(key: str, value: object) -> str:
    """A card metric as a person reads it: a count as a whole number with thousands separators, an evaluation
    figure to 4 decimals (an lm-eval accuracy with the score of guessing beside it), any other figure to 4
    decimals below 1,000 and to the unit with thousands separators from there (tokens_per_second 3,503)."""
    if isinstance(value, int) and not isinstance(value, bool):
        return f"{value:,}"
    if not isinstance(value, float):
        return str(value)
    if (key in COUNTS or key.startswith("tokens_trained.")) and value.is_integer():  # a component's tokens too
        return f"{int(value):,}"
    if not EVALUATED & set(key.split(".")):
        return f"{value:,.0f}" if math.isfinite(value) and abs(value) >= 1000 else f"{value:.4f}"
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
