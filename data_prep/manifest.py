"""The dataset manifest: what a dataset holds, and the version that is its content hash."""

from __future__ import annotations

import dataclasses
import hashlib
import json
from pathlib import Path
from typing import Protocol

from common.contracts import DOC_STATS, MANIFEST, PAD_TOKEN, TOKENIZER, DatasetRef
from common.digests import file_sha256
from data_prep.config import DataConfig, TokenizerConfig
from data_prep.errors import DataError
from data_prep.shards import StoredShard, token_dtype
from storage import Store

FORMAT = "pretrain-wds-v1"
RUNTIME_ONLY = {"workers", "partitions"}
# Where the corpus and a given tokenizer live. What they hold is recorded (the listing inside each
# source, every shard's and the tokenizer's sha256): the same corpus elsewhere is the same dataset.
LOCATIONS = {"sources", "file"}
MIXTURE = {"mixture", "dedup_across"}
"""A component's data section holds no mixture (``data_prep.mixture.components``): the keys are left out, so
that a dataset's version is what it was before mixtures existed, and no weight is ever part of one."""


class Vocabulary(Protocol):
    """What the manifest reads of a tokenizer (a ``tokenizers.Tokenizer``: not imported here, so that the
    readers of manifests, registration among them, do not depend on the tokenizers library)."""

    def get_vocab_size(self) -> int: ...

    def token_to_id(self, token: str) -> int | None: ...


def build(
    *,
    data: DataConfig,
    tokenizer_config: TokenizerConfig,
    tokenizer: Vocabulary,
    tokenizer_from: str,
    staging: Path,
    splits: dict[str, dict],
    stats: dict[str, int],
    sources: dict,
    sources_sha256: str,
) -> dict:
    """The manifest of a dataset staged in ``staging`` (tokenizer and doc stats written there)."""
    vocab_size = tokenizer.get_vocab_size()
    return {
        "format": FORMAT,
        "seq_len": data.seq_len,
        "token_dtype": token_dtype(vocab_size).name,
        "vocab_size": vocab_size,
        "eod_id": tokenizer.token_to_id(tokenizer_config.end_of_text()),
        "eod_token": tokenizer_config.end_of_text(),
        "pad_id": tokenizer.token_to_id(PAD_TOKEN),
        "tokenizer": {"file": TOKENIZER, "sha256": file_sha256(staging / TOKENIZER)},
        "doc_stats": {"file": DOC_STATS, "sha256": file_sha256(staging / DOC_STATS)},
        # Names of the kept documents, in order; `sources` describes the listing they came from.
        "sources_sha256": sources_sha256,
        "sources": sources,
        "config": {
            # Everything that shapes the content; the worker count and locations do not.
            "data": {k: v for k, v in dataclasses.asdict(data).items() if k not in RUNTIME_ONLY | LOCATIONS | MIXTURE},
            "tokenizer": {k: v for k, v in dataclasses.asdict(tokenizer_config).items() if k not in LOCATIONS},
            "tokenizer_from": tokenizer_from,
        },
        "splits": splits,
        "stats": stats,
        "summary": summary(stats),
    }


def summary(stats: dict[str, int]) -> dict[str, float]:
    """Rates for people and the validation report."""
    read = max(stats["documents_read"], 1)
    return {
        "duplicate_rate": round(stats["duplicates_total"] / read, 6),
        "skipped_rate": round(stats["skipped_total"] / read, 6),
        "bytes_per_token": round(stats["source_bytes"] / max(stats["train_tokens"] + stats["val_tokens"], 1), 4),
    }


def version_of(manifest: dict) -> tuple[str, bytes]:
    """The dataset version (hash of the manifest's canonical bytes) and those bytes."""
    data = json.dumps(manifest, indent=2, sort_keys=True).encode()
    return hashlib.sha256(data).hexdigest()[:16], data


def load_manifest(store: Store, ref: DatasetRef) -> dict:
    """The committed manifest of ``ref``, checked to hash to ``ref.version``: the shard digests it
    records are what every reader checks the shards against, so it must be the one prepared."""
    if not store.is_committed(ref.prefix):
        raise DataError(f"dataset {store.url(ref.prefix)} is not committed: rerun the prepare step")
    data = store.get_bytes(f"{ref.prefix}/{MANIFEST}", "manifest")
    actual = hashlib.sha256(data).hexdigest()[:16]  # as version_of
    if actual != ref.version:
        raise DataError(
            f"{store.url(f'{ref.prefix}/{MANIFEST}')} hashes to version {actual}, not {ref.version}: "
            "the dataset was modified after it was committed; prepare it again"
        )
    return json.loads(data)


RECORDED_FILES = {"tokenizer": (TOKENIZER, "tokenizer"), "doc_stats": (DOC_STATS, "object")}
"""The dataset files besides its shards whose sha256 the manifest records, by manifest key: the file's name and
its kind of read (``storage.READ_LIMITS``)."""


def read_recorded(store: Store, ref: DatasetRef, entry: str, manifest: dict | None = None) -> bytes:
    """The bytes of the dataset file the manifest records under ``entry`` (``tokenizer``, ``doc_stats``),
    refused unless they hash to the recorded sha256: a writer to ``datasets/`` who overwrites the file after
    the commit would otherwise pick the tokenizer of every model evaluated and registered from it."""
    manifest = load_manifest(store, ref) if manifest is None else manifest
    name, kind = RECORDED_FILES[entry]
    key = f"{ref.prefix}/{name}"
    data = store.get_bytes(key, kind)
    actual = hashlib.sha256(data).hexdigest()
    if actual != manifest[entry]["sha256"]:
        raise DataError(
            f"{store.url(key)} has sha256 {actual[:16]}…, not the {manifest[entry]['sha256'][:16]}… its manifest "
            f"records: it was changed after dataset {ref.version} was committed; prepare the dataset again"
        )
    return data


def stored_shards(store: Store, ref: DatasetRef, manifest: dict, split: str) -> list[StoredShard]:
    """The split's shards, each with the sha256 the manifest records: readers check it (``read_shard``). A blend's
    shard names the prefix of the component dataset that holds its file (``prefix``)."""
    return [
        StoredShard(store.url(f"{s.get('prefix', ref.prefix)}/{s['name']}"), s["sha256"])
        for s in manifest["splits"][split]["shards"]
    ]


def shard_urls(store: Store, ref: DatasetRef, manifest: dict, split: str) -> list[str]:
    """The split's shard URLs alone (reading them this way checks nothing: see ``stored_shards``)."""
    return [shard.url for shard in stored_shards(store, ref, manifest, split)]
