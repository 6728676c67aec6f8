"""A run's name for people: what trained, on what data, and the settings that differ from the defaults.

``gpt-tiny on python-stdlib``, ``gpt-small on code+docs lr=0.001 steps=12``: one name, made here from
the pipeline's config (as a mapping: ``dataclasses.asdict`` of it, or a card's recorded config), used
wherever a run is shown to a person: the MLflow run's name, the training run's record (``runs list``,
``runs show``, the columns and legends of ``runs compare``), the registry's card (``registry show``).
The ids stay the keys; the name says what they are.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any
from urllib.parse import urlparse

from common.settings import flat_settings, value_text

NAMED_SETTINGS = {
    "model.num_layers": "layers",
    "model.hidden_size": "hidden",
    "model.num_attention_heads": "heads",
    "model.num_query_groups": "groups",
    "model.ffn_hidden_size": "ffn",
    "model.kernels": "kernels",
    "tokenizer.vocab_size": "vocab",
    "data.seq_len": "seq",
    "data.max_documents": "docs",
    "train.init_from": "from",
    "train.steps": "steps",
    "train.lr": "lr",
    "train.min_lr": "min_lr",
    "train.warmup_steps": "warmup",
    "train.global_batch_size": "batch",
    "train.micro_batch_size": "micro",
    "train.weight_decay": "wd",
    "train.recompute": "recompute",
    "train.seed": "seed",
    "parallel.tensor_parallel": "tp",
    "parallel.pipeline_parallel": "pp",
    "parallel.sequence_parallel": "sp",
}
"""The settings a run's name shows when they differ from the defaults, in this order, by these short names:
what a reader compares runs by (size, optimisation, layout). Paths, stores and the bookkeeping settings are
left out (the data is named apart, by ``data_name``): MLflow's params and ``runs show`` hold every setting."""
MAX_RUN_NAME = 100
SOURCES_NAMED = 3
"""A data section of more sources than this names the first ones and counts the rest (``a+b+c+2``)."""


def run_name(config: Mapping[str, Any], defaults: Mapping[str, Any], model: str = "") -> str:
    """The registry's model name (``model`` when the config names none), ``on`` the data, then the named
    settings that differ from ``defaults``, e.g. ``gpt-tiny on python-stdlib lr=0.001 steps=12``; at most
    MAX_RUN_NAME characters (then ``+N`` says how many more settings differ)."""
    ours, theirs = flat_settings(config), flat_settings(defaults)
    name = str(ours.get("registry.model_name") or model or "pretrain")
    data = data_name(config.get("data", {}))
    if data:
        name = f"{name} on {data}"[:MAX_RUN_NAME]
    changes = [
        f"{short}={value_text(ours[key])}"
        for key, short in NAMED_SETTINGS.items()
        if key in ours and ours[key] != theirs.get(key)
    ]
    for shown, change in enumerate(changes):
        more = len(changes) - shown - 1
        if len(f"{name} {change}") + (len(f" +{more}") if more else 0) > MAX_RUN_NAME:
            return f"{name} +{len(changes) - shown}"
        name = f"{name} {change}"
    return name


def data_name(data: Mapping[str, Any]) -> str:
    """A data section in a few characters: a mixture's component names (``code+docs``), else each source's
    last path part (``python-stdlib``, ``corpus`` for ``/data/corpus/``, ``wiki`` for ``s3://b/wiki/*.jsonl``)."""
    mixture = data.get("mixture") or []
    names = [str(part.get("name", "")) for part in mixture if isinstance(part, Mapping)]
    if not names:
        names = [_source_name(str(source)) for source in data.get("sources") or []]
    names = [n for n in dict.fromkeys(names) if n]
    if len(names) > SOURCES_NAMED:
        return "+".join(names[:SOURCES_NAMED]) + f"+{len(names) - SOURCES_NAMED}"
    return "+".join(names)


def _source_name(source: str) -> str:
    """The last path part that is not a glob: ``/data/corpus/`` → corpus, ``s3://b/wiki/*.jsonl`` → wiki."""
    path = urlparse(source).path if "://" in source else source
    parts = [p for p in path.split("/") if p and not any(c in p for c in "*?[")]
    if not parts:
        return urlparse(source).netloc if "://" in source else source
    last = parts[-1]
    for suffix in (".gz", ".zst", ".bz2", ".xz", ".jsonl", ".json", ".parquet", ".txt", ".md"):
        last = last.removesuffix(suffix)
    return last
