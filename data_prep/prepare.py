"""The prepare step: raw sources → cleaned, de-duplicated, tokenized, packed, sharded dataset.

Two streaming passes over the corpus, so memory does not grow with its size:

1. **scan** — read, clean, filter and de-duplicate every document (workers clean and hash;
   the parent judges duplicates in order), remember one verdict byte per document, and
   feed the first ``tokenizer.train_bytes`` of kept training text to the BPE trainer.
2. **encode** — read the corpus again, send the kept documents to the workers to be
   cleaned and encoded, pack them into rows and write each shard as soon as it is full.

Shards are staged in a local directory, then uploaded to ``<store>/datasets/<version>/``
and committed with a ``_COMMITTED`` marker written last. The version is a hash of the
manifest, which names every shard's sha256, the tokenizer's hash, the source listing and
the config: same input and config, same bytes and same version.
"""

from __future__ import annotations

import csv
import dataclasses
import hashlib
import json
import logging
import tempfile
from array import array
from collections import Counter
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
from tokenizers import Tokenizer

from common.contracts import DOC_STATS, MANIFEST, TOKENIZER, DatasetRef, dataset_prefix
from common.errors import local_space
from common.settings import problems_error
from data_prep import manifest as manifests
from data_prep.clean import clean_text, content_hash
from data_prep.config import DataConfig, TokenizerConfig
from data_prep.console import PassProgress, log_skip_summary, skip_summary, sniffed_summary
from data_prep.dedup import Deduplicator, digest_key, near_row, sketch_words
from data_prep.filters import filtered_text
from data_prep.parallel import WorkerPool, trainer_threads
from data_prep.pii import KINDS as PII_KINDS
from data_prep.readers import Skips, iter_documents
from data_prep.shards import ShardInfo, ShardWriter, StoredShard, token_dtype
from data_prep.sources import DataError, Document, Ignored, RawFile, list_files, listing_hash, relative_names
from data_prep.tokenizer import EOD_TOKEN, byte_fallback_ids, set_encoder, train_tokenizer, worker_encoder
from storage import AlreadyCommitted, Store, open_store

log = logging.getLogger(__name__)

BATCH_BYTES = 1 << 20
BATCH_DOCS = 4096
DROP, TRAIN, VAL = 0, 1, 2


def split_of(digest: str, val_fraction: float) -> str:
    """Train or val, decided by the document's content hash (stable across runs)."""
    return "val" if int(digest[:8], 16) / 0xFFFFFFFF < val_fraction else "train"


def max_doc_bytes(data: DataConfig) -> int:
    """Raw bytes past which a document cannot clean down to ``max_chars`` (UTF-8: ≤ 4 bytes a character)."""
    return 4 * data.max_chars + 4


# --- worker side: settings are set in the parent before the fork --------------------
_data: DataConfig | None = None
_fallback_lut: np.ndarray | None = None


def _scan_batch(batch: list[Document]) -> tuple[list[str], np.ndarray, np.ndarray | None, list[int], dict[int, str]]:
    """Per document: the filter's skip reason (or ``""``), content key, near-dup row (LSH band keys
    and b-bit sketch: ``dedup.near_row``), split."""
    data = _data
    assert data is not None
    n, width = len(batch), data.minhash_bands + sketch_words(data.minhash_bands, data.minhash_rows)
    reasons, splits = [], []
    keys = np.zeros(n, dtype=np.uint64)
    bands = np.zeros((n, width), dtype=np.uint64) if data.near_dedup else None
    edited: dict[int, str] = {}
    for i, doc in enumerate(batch):
        # The same function as the encode pass: it encodes exactly the text judged and hashed here.
        text, reason, edits = filtered_text(doc.text, data)
        reasons.append(reason)
        splits.append(DROP)
        if reason:
            continue
        if edits:
            edited[i] = text  # redacted or cut: the tokenizer's sample takes it from here (usually none)
        digest = hashlib.sha256(text.encode("utf-8")).digest()
        keys[i] = digest_key(digest)
        splits[i] = VAL if split_of(digest.hex(), data.val_fraction) == "val" else TRAIN
        if bands is not None:
            # LSH keys and the b-bit sketch that verifies their hits, in one row (dedup.near_row).
            bands[i] = near_row(text, data.shingle_words, data.minhash_bands, data.minhash_rows)
    return reasons, keys, bands, splits, edited


def _encode_batch(batch: list[tuple[Document, int]]) -> list[tuple[str, int, int, np.ndarray, int, dict[str, int]]]:
    """Per kept document: sha256, characters, UTF-8 bytes, token ids, byte-fallback tokens, and
    the filters' edits (``pii_<kind>`` redactions…), counted here, where only kept documents pass."""
    data, lut, encoder = _data, _fallback_lut, worker_encoder()
    assert data is not None and lut is not None
    out = []
    for doc, _ in batch:
        # The scan's own function: the text encoded is the text it judged and hashed (checked by the digest).
        text, _, edits = filtered_text(doc.text, data)
        raw = text.encode("utf-8")
        ids = encoder.encode_batch([text])[0]
        out.append((hashlib.sha256(raw).hexdigest(), len(text), len(raw), ids, int(lut[ids].sum()), edits))
    return out


def _batches(items: Iterable, size_of) -> Iterator[list]:
    batch, size = [], 0
    for item in items:
        batch.append(item)
        size += size_of(item)
        if size >= BATCH_BYTES or len(batch) >= BATCH_DOCS:
            yield batch
            batch, size = [], 0
    if batch:
        yield batch


# --- pass 1 ---------------------------------------------------------------------------
@dataclass
class Scan:
    """What the scan pass decided, compactly: one verdict byte per document read."""

    files: list[RawFile]
    ignored: Ignored
    skips: Skips = field(default_factory=Skips)
    verdicts: bytearray = field(default_factory=bytearray)
    kept_keys: array = field(default_factory=lambda: array("Q"))
    documents: int = 0
    """Documents the readers produced (skipped files and records not included)."""
    filtered: int = 0
    """Of those, dropped by length or as duplicates."""
    sample_bytes: int = 0
    dedup_bytes: int = 0
    near_rejected: int = 0
    """Documents that shared an LSH band with an earlier kept one and were kept: not similar enough."""

    @property
    def kept(self) -> int:
        return len(self.kept_keys)


def _scan(data: DataConfig, scan: Scan, pool: WorkerPool, sample_bytes: int) -> Iterator[str]:
    """Run the scan pass; yields the tokenizer's training sample as it goes."""
    dedup = Deduplicator(data.near_dedup, data.minhash_bands, data.minhash_rows, data.near_dup_threshold)
    progress = PassProgress("scan", sum(f.size for f in scan.files))
    docs = iter_documents(progress.files(scan.files), data.text_field, max_doc_bytes(data), scan.skips)
    for batch, (reasons, keys, bands, splits, edited) in pool.map_ordered(_scan_batch, _batches(docs, lambda d: len(d.text))):
        progress.add_documents(len(batch))
        passing = np.flatnonzero([not r for r in reasons])
        verdicts = dedup.judge(keys[passing], bands[passing] if bands is not None else None)
        for i, verdict in zip(passing, verdicts, strict=True):
            reasons[i] = verdict
        for at, (doc, reason, key, split) in enumerate(zip(batch, reasons, keys, splits, strict=True)):
            scan.documents += 1
            if reason:
                scan.filtered += 1
                scan.skips.add(reason, doc.source, problem=False)
                scan.verdicts.append(DROP)
                continue
            scan.verdicts.append(split)
            scan.kept_keys.append(int(key))
            if split == TRAIN and scan.sample_bytes < sample_bytes:
                # The filters' text (redacted, cut) where they changed it, as pass 2 encodes it.
                text = edited[at] if at in edited else clean_text(doc.text, data.normalization)
                scan.sample_bytes += len(text.encode("utf-8"))
                yield text
            if data.max_documents and scan.kept >= data.max_documents:
                scan.dedup_bytes, scan.near_rejected = dedup.nbytes, dedup.rejected_candidates
                progress.finish()
                return
    scan.dedup_bytes, scan.near_rejected = dedup.nbytes, dedup.rejected_candidates
    progress.finish()


def scan_corpus(data: DataConfig, pool: WorkerPool, tokenizer_config: TokenizerConfig | None) -> tuple[Scan, Tokenizer | None]:
    """Pass 1. With a tokenizer config, also trains the tokenizer on the scan's sample."""
    ignored = Ignored(sniff=data.sniff_unlisted)
    files = list_files(data.sources, ignored, data.sniff_unlisted)
    if sniffed := sniffed_summary(ignored, relative_names(files)):
        log.info("%s", sniffed)
    scan = Scan(files=files, ignored=ignored)
    tokenizer = None
    if tokenizer_config is not None:
        tokenizer = train_tokenizer(_scan(data, scan, pool, tokenizer_config.train_bytes), tokenizer_config)
    else:
        for _ in _scan(data, scan, pool, 0):
            pass
    # Before the check: a corpus with nothing usable fails, and the summary says why.
    log_skip_summary(skip_summary(scan.skips, scan.ignored, relative_names(files)))
    _check_kept(data, scan)
    return scan, tokenizer


def _check_kept(data: DataConfig, scan: Scan) -> None:
    if not scan.kept:
        reasons = ", ".join(f"{k}={v}" for k, v in sorted(scan.skips.counts.items())) or "nothing readable"
        raise DataError(
            f"corpus {data.sources} has no usable text after cleaning ({scan.documents} documents read, "
            f"{len(scan.files)} files listed; skipped: {reasons}); point data.sources at text files or lower data.min_chars"
        )
    verdicts = np.frombuffer(scan.verdicts, dtype=np.uint8)
    if not (verdicts == VAL).any():
        # Tiny corpora: hold out the document with the smallest content key rather than nothing.
        kept_at = np.flatnonzero(verdicts)
        smallest = int(np.argmin(np.frombuffer(scan.kept_keys, dtype=np.uint64)))
        scan.verdicts[int(kept_at[smallest])] = VAL
    if not (np.frombuffer(scan.verdicts, dtype=np.uint8) == TRAIN).any():
        raise DataError(f"every document landed in validation: lower data.val_fraction ({data.val_fraction})")


# --- pass 2 ---------------------------------------------------------------------------
@dataclass
class Encoded:
    writers: dict[str, ShardWriter]
    source_bytes: int = 0
    val_bytes: int = 0
    val_doc_tokens: int = 0
    byte_fallback_tokens: int = 0
    sources_digest: hashlib._Hash = field(default_factory=hashlib.sha256)
    edits: Counter = field(default_factory=Counter)
    """The filters' edits in the kept documents: ``pii_<kind>`` redactions, ``c4_lines_removed``."""


def _kept_documents(data: DataConfig, scan: Scan, progress: PassProgress) -> Iterator[tuple[Document, int]]:
    """The kept documents again, with their split, by their position in the scan."""
    quiet = Skips(quiet=True)  # already counted and reported by the scan
    docs = iter_documents(progress.files(scan.files), data.text_field, max_doc_bytes(data), quiet)
    for ordinal, doc in enumerate(docs):
        if ordinal >= len(scan.verdicts):
            return
        if scan.verdicts[ordinal] != DROP:
            yield doc, scan.verdicts[ordinal]


def encode_corpus(data: DataConfig, scan: Scan, pool: WorkerPool, staging: Path, eod_id: int, dtype: np.dtype) -> Encoded:
    """Pass 2: encode the kept documents, pack and write shards, write doc stats."""
    writers = {
        split: ShardWriter(
            staging / "shards", split, eod_id, data.seq_len, data.sequences_per_sample, data.samples_per_shard, dtype
        )
        for split in ("train", "val")
    }
    result = Encoded(writers)
    relative = relative_names(scan.files)  # names inside their sources: the dataset does not say where they live
    kept = 0
    progress = PassProgress("encode", sum(f.size for f in scan.files))
    with open(staging / DOC_STATS, "w", newline="") as f:
        rows = csv.writer(f)
        rows.writerow(["source", "sha256", "split", "chars", "tokens", "byte_fallback"])
        batches = _batches(_kept_documents(data, scan, progress), lambda d: len(d[0].text))
        for batch, encoded in pool.map_ordered(_encode_batch, batches):
            progress.add_documents(len(batch))
            for (doc, verdict), (digest, chars, nbytes, ids, fallback, edits) in zip(batch, encoded, strict=True):
                if kept >= scan.kept or digest_key(bytes.fromhex(digest)) != scan.kept_keys[kept]:
                    raise DataError(
                        f"{doc.source} changed while the dataset was being prepared (its content differs from the scan): "
                        "rerun once the sources are stable"
                    )
                kept += 1
                split = "val" if verdict == VAL else "train"
                writers[split].add(ids)
                name = relative(doc.source)
                rows.writerow([name, digest, split, chars, len(ids), fallback])
                result.sources_digest.update(("\n" if kept > 1 else "").encode() + name.encode())
                result.source_bytes += nbytes
                result.byte_fallback_tokens += fallback
                result.edits.update(edits)
                if split == "val":
                    result.val_bytes += nbytes
                    result.val_doc_tokens += len(ids)
    progress.finish()
    if kept != scan.kept:
        raise DataError(
            f"the sources {data.sources} yielded {kept} of the {scan.kept} documents the scan kept: rerun once they are stable"
        )
    for split, writer in writers.items():
        if not writer.close():
            raise DataError(
                f"the {split} split holds fewer than {data.seq_len + 1} tokens: "
                "add text, lower data.seq_len or raise data.val_fraction"
            )
    return result


# --- the step -------------------------------------------------------------------------
def _load_tokenizer(store: Store, tokenizer_key: str) -> Tokenizer:
    tokenizer = Tokenizer.from_str(store.get_bytes(tokenizer_key).decode())
    if tokenizer.token_to_id(EOD_TOKEN) is None:
        raise DataError(
            f"tokenizer {store.url(tokenizer_key)} has no {EOD_TOKEN} token: give a tokenizer trained by this pipeline"
        )
    return tokenizer


def _given_tokenizer(store: Store, tokenizer_key: str, config: TokenizerConfig) -> tuple[Tokenizer | None, str]:
    """The tokenizer to reuse, if any, and where it came from."""
    if tokenizer_key:
        return _load_tokenizer(store, tokenizer_key), store.url(tokenizer_key)
    if config.file:
        location = config.file if config.file.startswith("s3://") else str(Path(config.file).expanduser().resolve())
        folder, _, name = location.rpartition("/")
        try:
            return _load_tokenizer(open_store(folder), name), location
        except Exception as e:  # a missing file, bad JSON (tokenizers raises plain Exception), no EOD token
            raise DataError(f"tokenizer.file {config.file!r} cannot be loaded ({e}): give a tokenizer.json") from e
    return None, ""


def _set_worker_state(data: DataConfig, tokenizer: Tokenizer | None = None) -> None:
    global _data, _fallback_lut
    _data = data
    if tokenizer is not None:
        set_encoder(tokenizer)
        lut = np.zeros(tokenizer.get_vocab_size(), dtype=bool)
        lut[byte_fallback_ids(tokenizer)] = True
        _fallback_lut = lut


def check_settings(data: DataConfig, tokenizer: TokenizerConfig) -> None:
    """Fail before any work on a setting that cannot work, naming it (the sections' own rules)."""
    problems = data.problems() + tokenizer.problems()
    if problems:
        raise DataError(str(problems_error(problems)))


def prepare_dataset(data: DataConfig, tokenizer_config: TokenizerConfig, store: Store, tokenizer_key: str = "") -> DatasetRef:
    """Build and commit the dataset. ``tokenizer_key`` names a tokenizer.json in the store to
    reuse (continued pretraining must keep its model's vocabulary); otherwise one is trained."""
    check_settings(data, tokenizer_config)
    store.check()
    given, given_from = _given_tokenizer(store, tokenizer_key, tokenizer_config)
    _set_worker_state(data)
    with WorkerPool(data.workers) as pool, trainer_threads(pool.workers):
        scan, trained = scan_corpus(data, pool, None if given else tokenizer_config)
    tokenizer = given or trained
    assert tokenizer is not None
    skipped = sum(scan.skips.counts.values())
    log.info(
        "scan: %s documents read, %s kept%s; tokenizer %s",
        f"{scan.documents:,}",
        f"{scan.kept:,}",
        f", {skipped:,} inputs skipped (by reason above)" if skipped else "",
        given_from or f"trained on {scan.sample_bytes:,} bytes",
    )
    eod_id = tokenizer.token_to_id(EOD_TOKEN)
    dtype = token_dtype(tokenizer.get_vocab_size())
    with tempfile.TemporaryDirectory(prefix="pretrain-dataset-") as tmp, local_space(tmp, "the dataset's staging"):
        staging = Path(tmp)
        _set_worker_state(data, tokenizer)
        with WorkerPool(data.workers) as pool:
            encoded = encode_corpus(data, scan, pool, staging, eod_id, dtype)
        tokenizer.save(str(staging / TOKENIZER))
        stats = _stats(scan, encoded)
        relative = relative_names(scan.files)
        manifest = manifests.build(
            data=data,
            tokenizer_config=tokenizer_config,
            tokenizer=tokenizer,
            # Which tokenizer, not where it lives: a store key (a base model's) or the config's file.
            tokenizer_from=tokenizer_key or ("tokenizer.file" if given else ""),
            staging=staging,
            splits={split: _split_entry(w) for split, w in encoded.writers.items()},
            stats=stats,
            sources={
                "listing_sha256": listing_hash(scan.files),
                "files": len(scan.files),
                "bytes": sum(f.size for f in scan.files),
                "ignored_by_suffix": dict(sorted(scan.ignored.items())),
                "skipped_examples": {reason: list(map(relative, names)) for reason, names in sorted(scan.skips.examples.items())},
            },
            sources_sha256=encoded.sources_digest.hexdigest(),
        )
        version, manifest_bytes = manifests.version_of(manifest)
        prefix = dataset_prefix(version)
        (staging / MANIFEST).write_bytes(manifest_bytes)
        if store.is_committed(prefix):
            log.info("dataset %s already committed in %s", version, store.uri)
        else:
            store.upload_dir(staging, prefix)
            try:
                store.commit(prefix, {"version": version})
            except AlreadyCommitted:
                pass  # a concurrent writer produced the same content
    log.info("dataset %s: %s", version, stats)
    return DatasetRef(store=store.uri, version=version, prefix=prefix, stats=stats)


def _split_entry(writer: ShardWriter) -> dict:
    return {
        "documents": writer.documents,
        "sequences": writer.sequences,
        "tokens": writer.tokens,
        "shards": [dataclasses.asdict(s) | {"name": f"shards/{s.name}"} for s in writer.shards],
    }


def _stats(scan: Scan, encoded: Encoded) -> dict[str, int]:
    skipped = scan.skips.counts
    # Reader-level skips (a binary file, a bad record) were would-be documents too.
    read = scan.documents + (sum(skipped.values()) - scan.filtered)
    return {
        "documents_read": read,
        "documents_kept": scan.kept,
        "skipped_total": sum(skipped.values()),
        **{f"skipped_{reason}": n for reason, n in sorted(skipped.items())},
        "duplicates_total": skipped.get("duplicate", 0) + skipped.get("near_duplicate", 0),
        "near_duplicates_rejected_by_verification": scan.near_rejected,
        "files_listed": len(scan.files),
        "files_ignored": sum(scan.ignored.values()),
        "files_sniffed": sum(scan.ignored.sniffed.values()),
        "train_documents": encoded.writers["train"].documents,
        "val_documents": encoded.writers["val"].documents,
        "train_tokens": encoded.writers["train"].tokens,
        "val_tokens": encoded.writers["val"].tokens,
        "source_bytes": encoded.source_bytes,
        # Bytes and tokens of the validation documents: bits per byte = nats/token ÷ ln 2
        # × tokens/byte, a loss that compares across tokenizers.
        "val_bytes": encoded.val_bytes,
        "val_doc_tokens": encoded.val_doc_tokens,
        "byte_fallback_tokens": encoded.byte_fallback_tokens,
        # The filters' edits in the kept documents (their drops are the skipped_* counts above).
        **{f"pii_{kind}": encoded.edits[f"pii_{kind}"] for kind in PII_KINDS},
        "c4_lines_removed": encoded.edits["c4_lines_removed"],
        "tokenizer_sample_bytes": scan.sample_bytes,
        # The one part of memory that grows with the corpus (hash-set slots per document).
        "dedup_state_bytes": scan.dedup_bytes,
    }


def load_manifest(store: Store, ref: DatasetRef) -> dict:
    """The committed manifest of ``ref``, checked to hash to ``ref.version``: the shard digests it
    records are what every reader checks the shards against, so it must be the one prepared."""
    if not store.is_committed(ref.prefix):
        raise DataError(f"dataset {store.url(ref.prefix)} is not committed: rerun the prepare step")
    data = store.get_bytes(f"{ref.prefix}/{MANIFEST}")
    actual = hashlib.sha256(data).hexdigest()[:16]  # as manifests.version_of
    if actual != ref.version:
        raise DataError(
            f"{store.url(f'{ref.prefix}/{MANIFEST}')} hashes to version {actual}, not {ref.version}: "
            "the dataset was modified after it was committed; prepare it again"
        )
    return json.loads(data)


def stored_shards(store: Store, ref: DatasetRef, manifest: dict, split: str) -> list[StoredShard]:
    """The split's shards, each with the sha256 the manifest records: readers check it (``read_shard``)."""
    return [StoredShard(store.url(f"{ref.prefix}/{s['name']}"), s["sha256"]) for s in manifest["splits"][split]["shards"]]


def shard_urls(store: Store, ref: DatasetRef, manifest: dict, split: str) -> list[str]:
    """The split's shard URLs alone (reading them this way checks nothing: see ``stored_shards``)."""
    return [shard.url for shard in stored_shards(store, ref, manifest, split)]


__all__ = [
    "DatasetRef",
    "ShardInfo",
    "content_hash",
    "prepare_dataset",
    "load_manifest",
    "shard_urls",
    "stored_shards",
    "scan_corpus",
]
