"""The prepare step: raw sources → cleaned, de-duplicated, tokenized, packed, sharded dataset.

The corpus listing is cut into partitions (``data.partitions``) and the work runs in stages,
each writing to the store under the run's work prefix (``partitions.work_prefix``):

1. **scan**, per partition (``scan.scan_partition``): read, clean, filter; content keys and
   near-duplicate signatures of every document;
2. **exact** and **near** de-duplication, per key shard (``dedup_stages``), then **resolve**:
   the kept documents, their splits and the tokenizer's sample;
3. the **tokenizer**, trained on that sample (or the one given);
4. **encode**, per partition (``encode.encode_partition``): token streams per split;
5. **pack**, per range of shards (``encode.pack_shards``): shards, uploaded as they are written;
6. **commit** (``commit_dataset``): the shards copied into ``<store>/datasets/<version>/``
   (server-side), then the tokenizer, the doc stats and the manifest, and the ``_COMMITTED``
   marker last; the work prefix is removed.

``prepare_dataset`` runs the stages one after the other in this process (each on a pool of
``data.workers`` processes); the Flyte workflow runs the per-partition and per-shard stages as
map tasks (``tasks/data.py``). The version is a hash of the manifest, which names every shard's
sha256, the tokenizer's hash, the source listing and the config: same input and config, same
bytes and same version, whatever the partition count.
"""

from __future__ import annotations

import csv
import dataclasses
import hashlib
import io
import logging
import tempfile
import uuid
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from tokenizers import Tokenizer

from common.contracts import DOC_STATS, EOD_TOKEN, MANIFEST, TOKENIZER, DatasetRef, dataset_prefix
from common.errors import local_space
from common.settings import problems_error
from data_prep import manifest as manifests
from data_prep.clean import content_hash
from data_prep.config import DataConfig, TokenizerConfig
from data_prep.console import log_skip_summary, skip_summary, sniffed_summary
from data_prep.dedup_stages import Resolution, check_kept, exact_shard, near_shard, resolve
from data_prep.encode import SPLITS, encode_partition, pack_shards, sample_texts, split_layout
from data_prep.errors import DataError
from data_prep.mixture_tokenizer import mixture_tokenizer_digest
from data_prep.parallel import WorkerPool, trainer_threads, worker_count
from data_prep.partitions import Partition, cut, run_key, work_prefix
from data_prep.pii import KINDS as PII_KINDS
from data_prep.readers import EXAMPLES_PER_REASON, Skips
from data_prep.scan import scan_partition
from data_prep.shards import ShardInfo, token_dtype
from data_prep.sources import Ignored, RawFile, list_files, listing_hash, relative_names
from data_prep.tokenizer import train_tokenizer
from data_prep.workers import set_worker_state
from storage import AlreadyCommitted, Store, open_store

log = logging.getLogger(__name__)


# --- settings and the listing ---------------------------------------------------------
def check_settings(data: DataConfig, tokenizer: TokenizerConfig) -> None:
    """Fail before any work on a setting that cannot work, naming it (the sections' own rules)."""
    problems = data.problems() + tokenizer.problems()
    if problems:
        raise DataError(str(problems_error(problems)))


@dataclass
class Listing:
    """The corpus as listed, cut into partitions: what every stage reads its files from."""

    files: list[RawFile]
    ignored: Ignored
    partitions: list[Partition]


def list_corpus(data: DataConfig, quiet: bool = False) -> Listing:
    """List the sources and cut the listing (every stage lists again: the same listing, in order)."""
    ignored = Ignored(sniff=data.sniff_unlisted)
    files = list_files(data.sources, ignored, data.sniff_unlisted, data.follow_symlinks)
    if not quiet and (sniffed := sniffed_summary(ignored, relative_names(files))):
        log.info("%s", sniffed)
    return Listing(files, ignored, cut(files, data.partitions))


def work_for(data: DataConfig, tokenizer_config: TokenizerConfig, tokenizer_from: str, listing: Listing, nonce: str) -> str:
    """The run's work prefix: named by what shapes its files, and ``nonce`` (two runs never share one)."""
    shaping = {
        k: v
        for k, v in dataclasses.asdict(data).items()
        if k not in manifests.RUNTIME_ONLY | manifests.LOCATIONS | manifests.MIXTURE
    }
    return work_prefix(run_key(listing_hash(listing.files), shaping, dataclasses.asdict(tokenizer_config), tokenizer_from, nonce))


# --- tokenizers -------------------------------------------------------------------------
def _load_tokenizer(store: Store, tokenizer_key: str, eod_token: str) -> Tokenizer:
    data = store.get_bytes(tokenizer_key, "tokenizer")
    named = mixture_tokenizer_digest(tokenizer_key)
    if named and hashlib.sha256(data).hexdigest()[:16] != named:  # a mixture's: named by its content
        raise DataError(
            f"tokenizer {store.url(tokenizer_key)} does not hash to the {named} its key names: it was changed "
            "after the mixture trained it; delete it and run again to train it anew"
        )
    tokenizer = Tokenizer.from_str(data.decode())
    if tokenizer.token_to_id(eod_token) is None:
        raise DataError(
            f"tokenizer {store.url(tokenizer_key)} has no {eod_token} token to end documents with: set "
            "tokenizer.eod_token to the one it has (its tokenizer_config.json's eos_token)"
        )
    return tokenizer


def given_tokenizer(store: Store, tokenizer_key: str, config: TokenizerConfig) -> tuple[Tokenizer | None, str]:
    """The tokenizer to reuse, if any, and where it came from."""
    if tokenizer_key:
        return _load_tokenizer(store, tokenizer_key, config.end_of_text()), store.url(tokenizer_key)
    if config.file:
        location = config.file if config.file.startswith("s3://") else str(Path(config.file).expanduser().resolve())
        folder, _, name = location.rpartition("/")
        try:
            return _load_tokenizer(open_store(folder), name, config.end_of_text()), location
        except Exception as e:  # a missing file, bad JSON (tokenizers raises plain Exception), no EOD token
            raise DataError(f"tokenizer.file {config.file!r} cannot be loaded ({e}): give a tokenizer.json") from e
    return None, ""


def work_tokenizer(store: Store, work: str) -> Tokenizer:
    return Tokenizer.from_str(store.get_bytes(f"{work}/{TOKENIZER}", "tokenizer").decode())


# --- the stages, each callable on its own (a Flyte task each: tasks/data.py) ---------------
@dataclass
class Preparation:
    """One preparation in progress: what every stage needs to find its inputs."""

    store: str
    """The store URI the dataset goes to; the work files live there too."""
    work: str
    """The work prefix (``partitions.work_prefix``), removed at commit."""
    data: DataConfig
    tokenizer: TokenizerConfig
    tokenizer_key: str = ""
    """A tokenizer.json in the store to reuse (a base model's), or ``""``."""
    listing_sha256: str = ""
    """The listing the partitions cut: a stage that lists something else stops."""
    partitions: int = 1

    @property
    def tokenizer_from(self) -> str:
        """Which tokenizer, not where it lives: a store key (a base model's) or the config's file."""
        return self.tokenizer_key or ("tokenizer.file" if self.tokenizer.file else "")


@dataclass(frozen=True)
class PackJob:
    """Shards ``[first, end)`` of one split: one pack task's share."""

    split: str
    first: int
    end: int


SHARDS_PER_PACK = 64
"""Shards a pack task writes (32 MB at the defaults): enough to amortise a task's start."""


def plan(
    store: Store, data: DataConfig, tokenizer_config: TokenizerConfig, tokenizer_key: str = "", nonce: str = ""
) -> Preparation:
    """Check the settings, the store and a given tokenizer, list the corpus and cut it."""
    check_settings(data, tokenizer_config)
    store.check()
    given, _ = given_tokenizer(store, tokenizer_key, tokenizer_config)  # a bad one fails now, not after the scan
    if given is None and tokenizer_config.end_of_text() != EOD_TOKEN:
        raise DataError(
            f"tokenizer.eod_token is {tokenizer_config.eod_token!r}, but a tokenizer trained here ends documents with "
            f"{EOD_TOKEN}: set it only with tokenizer.file"
        )
    listing = list_corpus(data)
    prep = Preparation(store.uri, "", data, tokenizer_config, tokenizer_key, listing_hash(listing.files), len(listing.partitions))
    prep.work = work_for(data, tokenizer_config, prep.tokenizer_from, listing, nonce or uuid.uuid4().hex)
    log.info(
        "%s files, %s MB, in %s partition(s)",
        f"{len(listing.files):,}",
        f"{sum(f.size for f in listing.files) / 1e6:,.1f}",
        prep.partitions,
    )
    return prep


def _listing(prep: Preparation) -> Listing:
    """The plan's listing again, checked to be the same."""
    listing = list_corpus(prep.data, quiet=True)
    if listing_hash(listing.files) != prep.listing_sha256 or len(listing.partitions) != prep.partitions:
        raise DataError(f"the corpus {prep.data.sources} changed since this preparation listed it: rerun once it is stable")
    return listing


def scan_stage(prep: Preparation, store: Store, index: int) -> None:
    listing = _listing(prep)
    set_worker_state(prep.data)
    with WorkerPool(prep.data.workers) as pool:
        scan_partition(prep.data, listing.files, listing.partitions[index], store, prep.work, pool)


def exact_stage(prep: Preparation, store: Store, shard: int) -> None:
    exact_shard(store, prep.work, prep.partitions, prep.data, shard, prep.partitions)


def near_stage(prep: Preparation, store: Store, shard: int) -> None:
    if prep.data.near_dedup:
        near_shard(store, prep.work, prep.partitions, prep.data, shard, prep.partitions)


def resolve_stage(prep: Preparation, store: Store) -> Resolution:
    """The global verdicts (``dedup_stages.resolve``), checked: a corpus with nothing usable fails
    here, after the skip summary says why (else the commit logs it, with every example)."""
    listing = _listing(prep)
    budget = 0 if prep.tokenizer_key or prep.tokenizer.file else prep.tokenizer.train_bytes
    resolution = resolve(store, prep.work, prep.partitions, prep.data, prep.partitions, budget)
    log.info("scan: %s documents read, %s kept", f"{resolution.documents:,}", f"{resolution.kept:,}")
    try:
        check_kept(prep.data, resolution, store, prep.work)
    except DataError:
        # The duplicates' examples are the encode stage's: the summary has none of them yet.
        log_skip_summary(skip_summary(_skips(resolution, {}), listing.ignored, relative_names(listing.files)))
        # The input must change before a run can succeed, and another run gets another work folder: this
        # one's scan files would only be left behind (as prepare_dataset, which cleans up after a failure).
        store.delete_prefix(prep.work)
        raise
    store.put_json(f"{prep.work}/resolution.json", dataclasses.asdict(resolution))
    return resolution


def tokenizer_stage(prep: Preparation, store: Store) -> None:
    """The given tokenizer, or one trained on ``resolve``'s sample, to ``<work>/tokenizer.json``."""
    tokenizer, given_from = given_tokenizer(store, prep.tokenizer_key, prep.tokenizer)
    if tokenizer is None:
        with trainer_threads(worker_count(prep.data.workers)):
            tokenizer = train_tokenizer(sample_texts(store, prep.work, prep.partitions), prep.tokenizer)
    store.put_bytes(f"{prep.work}/{TOKENIZER}", tokenizer.to_str().encode())
    sampled = f"trained on {store.get_json(f'{prep.work}/resolution.json')['sample_bytes']:,} bytes" if not given_from else ""
    log.info("tokenizer %s", given_from or sampled)


def encode_stage(prep: Preparation, store: Store, index: int) -> None:
    listing = _listing(prep)
    tokenizer = work_tokenizer(store, prep.work)
    set_worker_state(prep.data, tokenizer)
    with WorkerPool(prep.data.workers) as pool:
        encode_partition(
            listing.files, listing.partitions[index], store, prep.work, pool, *_token_format(tokenizer, prep.tokenizer)
        )


def _token_format(tokenizer: Tokenizer, config: TokenizerConfig) -> tuple[int, np.dtype]:
    return tokenizer.token_to_id(config.end_of_text()), token_dtype(tokenizer.get_vocab_size())


def pack_jobs(prep: Preparation, store: Store) -> list[PackJob]:
    """The pack tasks' shares of every split's shards."""
    jobs = []
    for split in SPLITS:
        _, count = split_layout(store, prep.work, prep.partitions, prep.data, split)
        jobs += [PackJob(split, lo, min(lo + SHARDS_PER_PACK, count)) for lo in range(0, count, SHARDS_PER_PACK)]
    return jobs


def pack_stage(prep: Preparation, store: Store, job: PackJob) -> list[ShardInfo]:
    _, dtype = _token_format(work_tokenizer(store, prep.work), prep.tokenizer)
    return pack_shards(store, prep.work, prep.partitions, prep.data, job.split, job.first, job.end, dtype)


def commit_stage(prep: Preparation, store: Store, packed: list[list[ShardInfo]]) -> DatasetRef:
    """Commit the dataset from the pack tasks' shards (in job order), then remove the work files."""
    resolution = Resolution.from_json(store.get_json(f"{prep.work}/resolution.json"))
    shards = {split: [s for job in packed for s in job if s.name.startswith(f"{split}-")] for split in SPLITS}
    ref = commit_dataset(prep, _listing(prep), store, resolution, shards)
    store.delete_prefix(prep.work)
    return ref


def prepare_dataset(data: DataConfig, tokenizer_config: TokenizerConfig, store: Store, tokenizer_key: str = "") -> DatasetRef:
    """Build and commit the dataset, every stage in this process, one partition or shard after
    another. ``tokenizer_key`` names a tokenizer.json in the store to reuse (continued pretraining
    must keep its model's vocabulary); otherwise one is trained."""
    prep = plan(store, data, tokenizer_config, tokenizer_key)
    try:
        for index in range(prep.partitions):
            scan_stage(prep, store, index)
        for shard in range(prep.partitions):
            exact_stage(prep, store, shard)
        for shard in range(prep.partitions):
            near_stage(prep, store, shard)
        resolve_stage(prep, store)
        tokenizer_stage(prep, store)
        for index in range(prep.partitions):
            encode_stage(prep, store, index)
        return commit_stage(prep, store, [pack_stage(prep, store, job) for job in pack_jobs(prep, store)])
    finally:
        store.delete_prefix(prep.work)  # after a failure too: nothing half-made stays behind


def scan_corpus(data: DataConfig, store: Store) -> Resolution:
    """The scan, de-duplication and resolve stages alone: which documents would be kept."""
    prep = plan(store, data, TokenizerConfig())
    try:
        for index in range(prep.partitions):
            scan_stage(prep, store, index)
        for shard in range(prep.partitions):
            exact_stage(prep, store, shard)
        for shard in range(prep.partitions):  # each near shard reads every exact shard's drops
            near_stage(prep, store, shard)
        return resolve_stage(prep, store)
    finally:
        store.delete_prefix(prep.work)


def _skips(resolution: Resolution, dedup_examples: dict[str, list[tuple[int, str]]]) -> Skips:
    """The skips of the whole corpus, with their first examples in corpus order."""
    skips = Skips()
    skips.counts.update(resolution.skips)
    skips.problems = set(resolution.problems)
    skips.details = dict(resolution.details)
    placed = {**resolution.examples, **dedup_examples}
    skips.examples = {
        reason: [name for _, name in sorted(placed[reason])[:EXAMPLES_PER_REASON]]
        for reason in resolution.skips
        if reason in placed
    }
    return skips


# --- commit -----------------------------------------------------------------------------
def commit_dataset(
    prep: Preparation, listing: Listing, store: Store, resolution: Resolution, shards: dict[str, list[ShardInfo]]
) -> DatasetRef:
    """Gather the stages' outputs into the manifest and commit the dataset (its version is known
    only now: the shards move from the work prefix by server-side copies)."""
    data, work, parts = prep.data, prep.work, prep.partitions
    tokenizer = work_tokenizer(store, work)
    encoded = [store.get_json(f"{work}/encoded/{i}.json") for i in range(parts)]
    counts, edits = Counter(), Counter()
    dedup_examples: dict[str, list[tuple[int, str]]] = {}
    for part in encoded:
        counts.update(part["counts"])
        edits.update(part["edits"])
        for reason, placed in part["examples"].items():
            dedup_examples.setdefault(reason, []).extend((int(p), n) for p, n in placed)
    for split in SPLITS:
        if not shards[split]:
            raise DataError(
                f"the {split} split holds fewer than {data.seq_len + 1} tokens: "
                "add text, lower data.seq_len or raise data.val_fraction"
            )
    skips = _skips(resolution, dedup_examples)
    relative = relative_names(listing.files)
    log_skip_summary(skip_summary(skips, listing.ignored, relative))
    with tempfile.TemporaryDirectory(prefix="pretrain-dataset-") as tmp, local_space(tmp, "the dataset's manifest and doc stats"):
        staging = Path(tmp)
        tokenizer.save(str(staging / TOKENIZER))
        sources_digest = _doc_stats(store, work, parts, staging / DOC_STATS)
        stats = _stats(resolution, listing, counts, edits, shards)
        manifest = manifests.build(
            data=data,
            tokenizer_config=prep.tokenizer,
            tokenizer=tokenizer,
            tokenizer_from=prep.tokenizer_from,
            staging=staging,
            splits={split: _split_entry(shards[split], counts[f"{split}_documents"]) for split in SPLITS},
            stats=stats,
            sources={
                "listing_sha256": listing_hash(listing.files),
                "files": len(listing.files),
                "bytes": sum(f.size for f in listing.files),
                "ignored_by_suffix": dict(sorted(listing.ignored.items())),
                "skipped_examples": {reason: list(map(relative, names)) for reason, names in sorted(skips.examples.items())},
            },
            sources_sha256=sources_digest,
        )
        version, manifest_bytes = manifests.version_of(manifest)
        prefix = dataset_prefix(version)
        (staging / MANIFEST).write_bytes(manifest_bytes)
        if store.is_committed(prefix):
            log.info("dataset %s already committed in %s", version, store.uri)
        else:
            for split in SPLITS:
                for shard in shards[split]:
                    store.copy(f"{work}/shards/{shard.name}", f"{prefix}/shards/{shard.name}")
            store.upload_dir(staging, prefix)
            try:
                store.commit(prefix, {"version": version})
            except AlreadyCommitted:
                pass  # a concurrent writer produced the same content
    log.info(
        "dataset %s: %s of %s documents kept (%s train, %s validation), %s + %s tokens; every figure in its manifest",
        version,
        f"{stats['documents_kept']:,}",
        f"{stats['documents_read']:,}",
        f"{stats['train_documents']:,}",
        f"{stats['val_documents']:,}",
        f"{stats['train_tokens']:,}",
        f"{stats['val_tokens']:,}",
    )
    return DatasetRef(store=store.uri, version=version, prefix=prefix, stats=stats)


def _doc_stats(store: Store, work: str, parts: int, path: Path) -> str:
    """Write the doc stats (the partitions' rows, in order) to ``path``; the hash of the kept
    documents' names, one a line, as the manifest's ``sources_sha256``."""
    digest = hashlib.sha256()
    first = True
    with open(path, "w", newline="") as f:
        rows = csv.writer(f)
        rows.writerow(["source", "sha256", "split", "chars", "tokens", "byte_fallback"])
        for index in range(parts):
            text = store.get_bytes(f"{work}/docstats/{index}.csv").decode()
            f.write(text)
            for row in csv.reader(io.StringIO(text, newline="")):
                digest.update(("" if first else "\n").encode() + row[0].encode())
                first = False
    return digest.hexdigest()


def _split_entry(shards: list[ShardInfo], documents: int) -> dict:
    return {
        "documents": documents,
        "sequences": sum(s.sequences for s in shards),
        "tokens": sum(s.tokens for s in shards),
        "shards": [dataclasses.asdict(s) | {"name": f"shards/{s.name}"} for s in shards],
    }


def _stats(
    resolution: Resolution, listing: Listing, counts: Counter, edits: Counter, shards: dict[str, list[ShardInfo]]
) -> dict[str, int]:
    skipped = resolution.skips
    return {
        # Reader-level skips (a binary file, a bad record) were would-be documents too.
        "documents_read": resolution.documents + resolution.reader_skips,
        "documents_kept": resolution.kept,
        "skipped_total": sum(skipped.values()),
        **{f"skipped_{reason}": n for reason, n in sorted(skipped.items())},
        "duplicates_total": skipped.get("duplicate", 0) + skipped.get("near_duplicate", 0),
        "near_duplicates_rejected_by_verification": resolution.near_rejected,
        "files_listed": len(listing.files),
        "files_ignored": sum(listing.ignored.values()),
        "files_sniffed": sum(listing.ignored.sniffed.values()),
        "train_documents": counts["train_documents"],
        "val_documents": counts["val_documents"],
        "train_tokens": sum(s.tokens for s in shards["train"]),
        "val_tokens": sum(s.tokens for s in shards["val"]),
        "source_bytes": counts["source_bytes"],
        # Bytes and tokens of the validation documents: bits per byte = nats/token ÷ ln 2
        # × tokens/byte, a loss that compares across tokenizers.
        "val_bytes": counts["val_bytes"],
        "val_doc_tokens": counts["val_doc_tokens"],
        "byte_fallback_tokens": counts["byte_fallback_tokens"],
        # The filters' edits in the kept documents (their drops are the skipped_* counts above).
        **{f"pii_{kind}": edits[f"pii_{kind}"] for kind in PII_KINDS},
        "c4_lines_removed": edits["c4_lines_removed"],
        "tokenizer_sample_bytes": resolution.sample_bytes,
    }


__all__ = [
    "DatasetRef",
    "ShardInfo",
    "content_hash",
    "prepare_dataset",
    "scan_corpus",
]
