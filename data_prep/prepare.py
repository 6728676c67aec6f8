"""The prepare step: raw sources → cleaned, de-duplicated, tokenized, packed, sharded dataset.

Everything is built in a local staging directory first, then uploaded to
``<store>/datasets/<version>/`` and committed with a ``_COMMITTED`` marker written last.
The version is a hash of the manifest, which names every shard's sha256, the tokenizer's
hash, the source listing and the config: same input and config, same version.
"""

from __future__ import annotations

import csv
import dataclasses
import hashlib
import json
import logging
import tempfile
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
from tokenizers import Tokenizer

from data_prep.clean import ExactDeduplicator, clean_text, content_hash
from data_prep.config import DataConfig, TokenizerConfig
from data_prep.shards import ShardInfo, pack, token_dtype, write_shards
from data_prep.sources import DataError, Document, iter_documents
from data_prep.tokenizer import EOD_TOKEN, PAD_TOKEN, byte_fallback_ids, encode_parallel, train_tokenizer
from storage import AlreadyCommitted, Store

log = logging.getLogger(__name__)

MANIFEST = "manifest.json"
TOKENIZER = "tokenizer.json"
DOC_STATS = "doc_stats.csv"


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


def split_of(digest: str, val_fraction: float) -> str:
    """Train or val, decided by the document's content hash (stable across runs)."""
    return "val" if int(digest[:8], 16) / 0xFFFFFFFF < val_fraction else "train"


def collect_documents(config: DataConfig) -> tuple[list[tuple[Document, str, str]], Counter, int]:
    """Clean, filter and de-duplicate. Returns (document, digest, split) triples, skip counts, files read."""
    skipped: Counter = Counter()
    dedup = ExactDeduplicator()
    kept: list[tuple[Document, str, str]] = []
    read = 0
    for doc in iter_documents(config.sources, config.text_field, skipped):
        read += 1
        text = clean_text(doc.text)
        if not text:
            skipped["empty"] += 1
            continue
        if len(text) < config.min_chars:
            skipped["too_short"] += 1
            continue
        if len(text) > config.max_chars:
            skipped["too_long"] += 1
            continue
        digest = content_hash(text)
        if dedup.seen(digest):
            skipped["duplicate"] += 1
            continue
        kept.append((Document(doc.source, text), digest, split_of(digest, config.val_fraction)))
        if config.max_documents and len(kept) >= config.max_documents:
            break
    if not kept:
        reasons = ", ".join(f"{k}={v}" for k, v in sorted(skipped.items())) or "nothing readable"
        raise DataError(
            f"corpus {config.sources} has no usable text after cleaning ({read} documents read; skipped: {reasons}); "
            "point data.sources at text files or lower data.min_chars"
        )
    if not any(split == "val" for _, _, split in kept):
        # Tiny corpora: hold out the document with the smallest hash rather than nothing.
        i = min(range(len(kept)), key=lambda j: kept[j][1])
        kept[i] = (kept[i][0], kept[i][1], "val")
    if all(split == "val" for _, _, split in kept):
        raise DataError(f"every document landed in validation: lower data.val_fraction ({config.val_fraction})")
    return kept, skipped, read


def prepare_dataset(data: DataConfig, tokenizer_config: TokenizerConfig, store: Store, tokenizer_key: str = "") -> DatasetRef:
    """Build and commit the dataset. ``tokenizer_key`` names a tokenizer.json in the store to
    reuse (continued pretraining must keep its model's vocabulary); otherwise one is trained."""
    store.check()
    kept, skipped, read = collect_documents(data)
    log.info("%d documents kept of %d read; skipped %s", len(kept), read, dict(skipped))

    if tokenizer_key:
        tokenizer = Tokenizer.from_str(store.get_bytes(tokenizer_key).decode())
        if tokenizer.token_to_id(EOD_TOKEN) is None:
            raise DataError(f"tokenizer {store.url(tokenizer_key)} has no {EOD_TOKEN} token")
    else:
        tokenizer = train_tokenizer([d.text for d, _, split in kept if split == "train"], tokenizer_config)
    eod_id = tokenizer.token_to_id(EOD_TOKEN)
    ids = encode_parallel(tokenizer, [d.text for d, _, _ in kept], data.workers)
    vocab_size = tokenizer.get_vocab_size()
    dtype = token_dtype(vocab_size)

    with tempfile.TemporaryDirectory(prefix="pretrain-dataset-") as tmp:
        staging = Path(tmp)
        tokenizer_path = staging / TOKENIZER
        tokenizer.save(str(tokenizer_path))
        splits: dict[str, dict] = {}
        for split in ("train", "val"):
            docs = [ids[i] for i, (_, _, s) in enumerate(kept) if s == split]
            rows = pack(docs, eod_id, data.seq_len, dtype)
            if len(rows) == 0:
                raise DataError(
                    f"the {split} split holds fewer than {data.seq_len + 1} tokens: "
                    "add text, lower data.seq_len or raise data.val_fraction"
                )
            shards = write_shards(rows, staging / "shards", split, data.sequences_per_sample, data.samples_per_shard)
            splits[split] = {
                "documents": len(docs),
                "sequences": int(len(rows)),
                "tokens": int(rows.size),
                "shards": [dataclasses.asdict(s) | {"name": f"shards/{s.name}"} for s in shards],
            }
        fallback = _write_doc_stats(staging / DOC_STATS, kept, ids, byte_fallback_ids(tokenizer))

        stats = {
            "documents_read": read,
            "documents_kept": len(kept),
            "skipped_total": sum(skipped.values()),
            **{f"skipped_{reason}": n for reason, n in sorted(skipped.items())},
            "train_tokens": splits["train"]["tokens"],
            "val_tokens": splits["val"]["tokens"],
            "source_bytes": sum(len(d.text.encode()) for d, _, _ in kept),
            # Bytes and tokens of the validation documents: bits per byte = nats/token ÷ ln 2
            # × tokens/byte, a loss that compares across tokenizers.
            "val_bytes": sum(len(d.text.encode()) for d, _, split in kept if split == "val"),
            "val_doc_tokens": sum(len(ids[i]) for i, (_, _, split) in enumerate(kept) if split == "val"),
            "byte_fallback_tokens": fallback,
        }
        manifest = {
            "format": "pretrain-wds-v1",
            "seq_len": data.seq_len,
            "token_dtype": dtype.name,
            "vocab_size": vocab_size,
            "eod_id": eod_id,
            "pad_id": tokenizer.token_to_id(PAD_TOKEN),
            "tokenizer": {"file": TOKENIZER, "sha256": _sha256(tokenizer_path)},
            "doc_stats": {"file": DOC_STATS, "sha256": _sha256(staging / DOC_STATS)},
            "sources_sha256": hashlib.sha256("\n".join(d.source for d, _, _ in kept).encode()).hexdigest(),
            "config": {
                "data": dataclasses.asdict(data),
                "tokenizer": dataclasses.asdict(tokenizer_config),
                "tokenizer_from": store.url(tokenizer_key) if tokenizer_key else "",
            },
            "splits": splits,
            "stats": stats,
        }
        manifest_bytes = json.dumps(manifest, indent=2, sort_keys=True).encode()
        version = hashlib.sha256(manifest_bytes).hexdigest()[:16]
        prefix = f"datasets/{version}"
        (staging / MANIFEST).write_bytes(manifest_bytes)
        if store.is_committed(prefix):
            log.info("dataset %s already committed in %s", version, store.uri)
        else:
            store.upload_dir(staging, prefix)
            try:
                store.commit(prefix, {"version": version})
            except AlreadyCommitted:
                pass  # a concurrent writer produced the same content
    return DatasetRef(store=store.uri, version=version, prefix=prefix, stats=stats)


def _write_doc_stats(path: Path, kept: list[tuple[Document, str, str]], ids: list[np.ndarray], fallback_ids: np.ndarray) -> int:
    """One row per kept document for the validation stage; returns the byte-fallback token total."""
    total = 0
    with open(path, "w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(["source", "sha256", "split", "chars", "tokens", "byte_fallback"])
        for (doc, digest, split), doc_ids in zip(kept, ids, strict=True):
            fallback = int(np.isin(doc_ids, fallback_ids).sum())
            total += fallback
            writer.writerow([doc.source, digest, split, len(doc.text), len(doc_ids), fallback])
    return total


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def load_manifest(store: Store, ref: DatasetRef) -> dict:
    if not store.is_committed(ref.prefix):
        raise DataError(f"dataset {store.url(ref.prefix)} is not committed: rerun the prepare step")
    return store.get_json(f"{ref.prefix}/{MANIFEST}")


def shard_urls(store: Store, ref: DatasetRef, manifest: dict, split: str) -> list[str]:
    return [store.url(f"{ref.prefix}/{s['name']}") for s in manifest["splits"][split]["shards"]]


__all__ = ["DatasetRef", "ShardInfo", "prepare_dataset", "load_manifest", "shard_urls"]
