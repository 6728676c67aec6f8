"""A blend: several prepared datasets, each with its weight, committed as one dataset that training reads.

A blend copies no shard. Its manifest has the keys of a dataset's (``seq_len``, ``vocab_size``, the
tokenizer, ``splits``, ``stats``), every shard entry naming the component dataset that holds it
(``prefix``) and its index in ``mixture`` (``component``), and a ``mixture`` list: each component's
name, normalised weight, ``max_epochs``, dataset version and the figures a reader needs per component
(rows, validation bytes and tokens). Training draws each component's share of every global batch
(``data_prep.blend.BlendOrder``); evaluation scores each component's validation rows on their own.

The weights are in the blend's manifest and so in its version, and in no component's: changing only the
weights commits another blend of the same component datasets, and prepares nothing.
"""

from __future__ import annotations

import logging
from collections import Counter
from dataclasses import dataclass

import numpy as np

from common.contracts import MANIFEST, TOKENIZER, DatasetRef, dataset_prefix
from data_prep import manifest as manifests
from data_prep.errors import DataError
from data_prep.manifest import load_manifest
from storage import AlreadyCommitted, Store

log = logging.getLogger(__name__)

FORMAT = "pretrain-mixture-v1"
REASON = "cross_component_duplicate"
"""What a later component's duplicate of an earlier one's document is counted as (``data_prep.dedup_across``)."""
SHARED = ("seq_len", "token_dtype", "vocab_size", "eod_id", "eod_token", "pad_id", "tokenizer")
"""What every component must agree on: one tokenizer and one row width for the whole mixture."""


@dataclass(frozen=True)
class Part:
    """One component of a blend: its prepared dataset and its share."""

    name: str
    dataset: DatasetRef
    weight: float
    max_epochs: float


def _shard_entries(part: Part, index: int, manifest: dict, split: str, excluded: list[int]) -> list[dict]:
    """A component's shard entries for the blend: where each is, and the rows of it the blend leaves out."""
    entries, start, left_out = [], 0, np.asarray(excluded, dtype=np.int64)
    for shard in manifest["splits"][split]["shards"]:
        n = int(shard["sequences"])
        inside = left_out[(left_out >= start) & (left_out < start + n)] - start
        entry = {**shard, "prefix": part.dataset.prefix, "component": index}
        if inside.size:
            entry["excluded"] = inside.tolist()
        entries.append(entry)
        start += n
    return entries


def blend_manifest(parts: list[Part], manifests_: list[dict], exclusions: dict | None = None) -> dict:
    """The blend's manifest from its components' (checked to share a tokenizer and a row width), without
    the rows of ``exclusions`` (``data_prep.dedup_across``: duplicates of an earlier component's documents)."""
    first = manifests_[0]
    for part, manifest in zip(parts[1:], manifests_[1:], strict=True):
        differ = [k for k in SHARED if manifest.get(k) != first.get(k)]
        if differ:
            raise DataError(
                f"data.mixture[{part.name}]: its dataset {part.dataset.version} differs from "
                f"data.mixture[{parts[0].name}]'s in {', '.join(differ)}: a mixture trains one tokenizer and "
                "one seq_len; prepare every component with the same tokenizer and data.seq_len"
            )
    versions = [p.dataset.version for p in parts]
    for i, part in enumerate(parts):
        if versions.index(part.dataset.version) != i:
            first = parts[versions.index(part.dataset.version)].name
            raise DataError(
                f"data.mixture[{part.name}] prepares the same dataset as data.mixture[{first}] "
                f"({part.dataset.version}): merge the two components, or give them different sources or settings"
            )
    total = sum(p.weight for p in parts)
    found = (exclusions or {}).get("components") or [{"exact": 0, "near": 0, "rows": {"train": [], "val": []}}] * len(parts)
    if [f.get("dataset", p.dataset.version) for f, p in zip(found, parts, strict=True)] != [p.dataset.version for p in parts]:
        raise DataError("the exclusion list was made for other datasets than the blend's: run the pipeline again")
    splits = {}
    for split in ("train", "val"):
        entries = [
            entry
            for i, (part, manifest) in enumerate(zip(parts, manifests_, strict=True))
            for entry in _shard_entries(part, i, manifest, split, found[i]["rows"][split])
        ]
        splits[split] = {
            key: sum(int(m["splits"][split][key]) for m in manifests_) for key in ("documents", "sequences", "tokens")
        } | {"shards": entries}
        splits[split]["sequences"] -= sum(len(f["rows"][split]) for f in found)
    stats: Counter[str] = Counter()
    for manifest in manifests_:
        stats.update({k: int(v) for k, v in manifest["stats"].items()})
    stats[REASON] = sum(f["exact"] + f["near"] for f in found)
    mixture = [
        {
            "name": part.name,
            "weight": part.weight / total,
            "max_epochs": part.max_epochs,
            "dataset": part.dataset.version,
            "prefix": part.dataset.prefix,
            "train_sequences": int(manifest["splits"]["train"]["sequences"]) - len(f["rows"]["train"]),
            "val_sequences": int(manifest["splits"]["val"]["sequences"]) - len(f["rows"]["val"]),
            REASON: f["exact"] + f["near"],
            f"{REASON}_by_kind": {"exact": f["exact"], "near": f["near"]},
            "stats": {k: int(manifest["stats"][k]) for k in ("train_tokens", "val_bytes", "val_doc_tokens", "documents_kept")},
        }
        for part, manifest, f in zip(parts, manifests_, found, strict=True)
    ]
    for part, entry in zip(parts, mixture, strict=True):
        if entry["train_sequences"] <= 0 or entry["val_sequences"] <= 0:
            raise DataError(
                f"data.mixture[{part.name}]: every row of its {'train' if entry['train_sequences'] <= 0 else 'val'} split "
                "duplicates an earlier component's documents: drop the component, or set data.dedup_across: false"
            )
    stats_dict = dict(sorted(stats.items()))
    return {
        "format": FORMAT,
        **{k: first[k] for k in SHARED},
        "splits": splits,
        "stats": stats_dict,
        "summary": manifests.summary(stats_dict),
        "mixture": mixture,
    }


def commit_blend(store: Store, parts: list[Part], exclusions: dict | None = None) -> DatasetRef:
    """Commit the blend of ``parts`` without the rows of ``exclusions`` (idempotent: the same parts, weights and
    exclusions are the same version) and return it; a single part is its own dataset, unchanged (a plain run
    is a mixture of one)."""
    if len(parts) == 1:
        return parts[0].dataset
    components = [load_manifest(store, p.dataset) for p in parts]
    manifest = blend_manifest(parts, components, exclusions)
    version, data = manifests.version_of(manifest)
    prefix = dataset_prefix(version)
    if not store.is_committed(prefix):
        tokenizer = manifests.read_recorded(store, parts[0].dataset, "tokenizer", components[0])
        store.put_bytes(f"{prefix}/{TOKENIZER}", tokenizer)
        store.put_bytes(f"{prefix}/{MANIFEST}", data)
        try:
            store.commit(prefix, {"version": version})
        except AlreadyCommitted:
            pass  # a concurrent run committed the same blend
    shares = ", ".join(f"{m['name']} {m['weight']:.3f}" for m in manifest["mixture"])
    log.info("blend %s of %s datasets: %s", version, len(parts), shares)
    return DatasetRef(store=store.uri, version=version, prefix=prefix, stats=manifest["stats"])
