"""De-duplication in stages, each seeing a shard of the keys, and the global verdicts.

1. ``exact_shard`` (one per key shard): the content keys of every partition that fall in the
   shard; every document but the first of a key is an exact duplicate.
2. ``near_shard`` (one per key shard): the LSH band keys in the shard of the documents left;
   candidate pairs from each bucket (``dedup.band_pairs``), verified with their sketches.
3. ``resolve`` (one): near-duplicate drops from the verified pairs in document-id order, the
   ``data.max_documents`` cut, the split of every document, the tokenizer's sample, and the
   counts, written per partition for the encode stage.

A shard holds ``16 bytes × documents × bands / shards`` of band entries, so the shard count, not
one process's memory, grows with the corpus. Every stage's output depends only on the corpus and
the config, never on how many partitions or shards did the work.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

import numpy as np

from data_prep.config import DataConfig
from data_prep.dedup import band_pairs, near_drops, repeated, similar
from data_prep.errors import DataError
from data_prep.partitions import get_array, put_array
from data_prep.readers import EXAMPLES_PER_REASON
from data_prep.scan import PartitionScan
from data_prep.workers import TRAIN, VAL

DUPLICATE, NEAR_DUPLICATE, PAST_CUT = 3, 4, 5
"""Verdicts beyond the scan's: 0 dropped by a filter, ``TRAIN``, ``VAL``, then these."""


def passing_cut(store, work: str, parts: int, max_documents: int) -> int:
    """The id of the ``max_documents``-th document that passes the filters; the last possible id
    when there is no such cut."""
    last = np.iinfo(np.uint64).max
    if not max_documents:
        return int(last)
    seen = 0
    for index in range(parts):
        passing = PartitionScan.load(store, work, index).passing()
        if seen + len(passing) >= max_documents:
            return int(passing[max_documents - seen - 1])
        seen += len(passing)
    return int(last)


def _passing(scan: PartitionScan, cut: int) -> tuple[np.ndarray, np.ndarray]:
    """The ids of the partition's documents that pass its filters (up to the cut), and a mask of
    them over the per-passing-document arrays."""
    passing = scan.passing()
    within = passing <= np.uint64(cut)
    return passing[within], within


def exact_shard(store, work: str, parts: int, data: DataConfig, shard: int, shards: int) -> None:
    cut = passing_cut(store, work, parts, data.max_documents)
    keys, docs = [np.zeros(0, np.uint64)], [np.zeros(0, np.uint64)]
    for index in range(parts):
        scan = PartitionScan.load(store, work, index)
        passing, within = _passing(scan, cut)
        part_keys = scan.array("keys")[within]
        mine = part_keys % np.uint64(shards) == np.uint64(shard)
        keys.append(part_keys[mine])
        docs.append(passing[mine])
    put_array(store, f"{work}/exact/{shard}.npy", repeated(np.concatenate(keys), np.concatenate(docs)))


def _exact_drops(store, work: str, shards: int) -> np.ndarray:
    return np.sort(np.concatenate([get_array(store, f"{work}/exact/{s}.npy") for s in range(shards)]))


def near_shard(store, work: str, parts: int, data: DataConfig, shard: int, shards: int) -> None:
    cut = passing_cut(store, work, parts, data.max_documents)
    exact, bands = _exact_drops(store, work, shards), data.minhash_bands
    keys, docs = [np.zeros(0, np.uint64)], [np.zeros(0, np.uint64)]
    for index in range(parts):
        scan = PartitionScan.load(store, work, index)
        passing, within = _passing(scan, cut)
        alive = ~np.isin(passing, exact)
        band = scan.array("near")[within][alive, :bands]
        owners = np.repeat(passing[alive], bands)
        mine = band.ravel() % np.uint64(shards) == np.uint64(shard)
        keys.append(band.ravel()[mine])
        docs.append(owners[mine])
    later, earlier = band_pairs(np.concatenate(keys), np.concatenate(docs))
    involved = np.unique(np.concatenate([later, earlier]))
    # The sketches of the documents in a pair only: a few of the corpus's.
    ids, sketches = [np.zeros(0, np.uint64)], [np.zeros((0, bands * data.minhash_rows), np.uint8)]
    for index in range(parts):
        scan = PartitionScan.load(store, work, index)
        passing, within = _passing(scan, cut)
        wanted = np.isin(passing, involved)
        if wanted.any():
            rows = np.ascontiguousarray(scan.array("near")[within][wanted, bands:])
            ids.append(passing[wanted])
            sketches.append(rows.view(np.uint8)[:, : bands * data.minhash_rows])
    held, sketch = np.concatenate(ids), np.concatenate(sketches)
    a, b = sketch[np.searchsorted(held, later)], sketch[np.searchsorted(held, earlier)]
    alike = similar(a, b, data.near_dup_threshold).astype(np.uint64)
    put_array(store, f"{work}/near/{shard}.npy", np.stack([later, earlier, alike], axis=1))


@dataclass
class Resolution:
    """What ``resolve`` decided, in counts (written as ``<work>/resolution.json``)."""

    cut: int
    documents: int = 0
    """Documents read up to the cut."""
    kept: int = 0
    train: int = 0
    skips: dict[str, int] = field(default_factory=dict)
    problems: list[str] = field(default_factory=list)
    details: dict[str, str] = field(default_factory=dict)
    examples: dict[str, list[tuple[int, str]]] = field(default_factory=dict)
    """Example names with their position, of the filters' and readers' skips (the encode stage
    adds the duplicates')."""
    reader_skips: int = 0
    """Inputs the readers skipped (a bad file or record) up to the cut: would-be documents too."""
    near_rejected: int = 0
    sample_bytes: int = 0
    smallest: tuple[int, int, int] | None = None
    """(content key, partition, place) of the kept document with the smallest key."""

    @classmethod
    def from_json(cls, record: dict) -> Resolution:
        """Back from ``dataclasses.asdict`` through JSON (tuples came back as lists)."""
        examples = {reason: [(int(p), name) for p, name in placed] for reason, placed in record["examples"].items()}
        smallest = tuple(record["smallest"]) if record["smallest"] is not None else None
        return cls(**{**record, "examples": examples, "smallest": smallest})


def resolve(store, work: str, parts: int, data: DataConfig, shards: int, sample_budget: int) -> Resolution:
    cut = passing_cut(store, work, parts, data.max_documents)
    exact = _exact_drops(store, work, shards)
    pairs = np.concatenate([get_array(store, f"{work}/near/{s}.npy") for s in range(shards)]) if data.near_dedup else None
    near = np.zeros(0, np.uint64)
    result = Resolution(cut=cut)
    if pairs is not None and len(pairs):
        pairs = np.unique(pairs, axis=0)  # a pair met in two shards (two shared bands) once
        near, result.near_rejected = near_drops(pairs[:, 0], pairs[:, 1], pairs[:, 2].astype(bool))
    skips: Counter = Counter()
    sample, sampled = [], 0
    for index in range(parts):
        scan = PartitionScan.load(store, work, index)
        docs, codes = scan.array("docs"), scan.array("codes")
        verdicts = np.zeros(len(docs), dtype=np.uint8)
        passing_at = np.flatnonzero(codes == 0)
        splits, sizes, keys = scan.array("splits"), scan.array("sizes"), scan.array("keys")
        passing = docs[passing_at]
        verdicts[passing_at] = splits
        verdicts[passing_at[np.isin(passing, exact)]] = DUPLICATE
        verdicts[passing_at[np.isin(passing, near)]] = NEAR_DUPLICATE
        verdicts[docs > np.uint64(cut)] = PAST_CUT
        read = docs <= np.uint64(cut)
        result.documents += int(read.sum())
        for code, n in zip(*np.unique(codes[read & (codes > 0)], return_counts=True), strict=True):
            skips[scan.reasons[int(code) - 1]] += int(n)
        events = scan.array("events")
        for _, reason, n in events[events[:, 0] <= np.uint64(cut)].tolist():
            skips[scan.reasons[reason]] += n
            result.reader_skips += n
        for reason, placed in scan.examples.items():
            kept_examples = result.examples.setdefault(reason, [])
            kept_examples += [(p, name) for p, name in placed if p <= cut][: EXAMPLES_PER_REASON - len(kept_examples)]
        result.problems = sorted(set(result.problems) | set(scan.problems))
        for reason, detail in scan.details.items():
            result.details.setdefault(reason, detail)
        kept_at = np.flatnonzero((verdicts == TRAIN) | (verdicts == VAL))
        result.kept += len(kept_at)
        passing_place = np.searchsorted(passing_at, kept_at)
        if len(kept_at):
            place = int(np.argmin(keys[passing_place]))
            candidate = (int(keys[passing_place][place]), index, int(kept_at[place]))
            if result.smallest is None or candidate < result.smallest:
                result.smallest = candidate
        train_at = np.flatnonzero(verdicts == TRAIN)
        result.train += len(train_at)
        for doc, size in zip(docs[train_at].tolist(), sizes[np.searchsorted(passing_at, train_at)].tolist(), strict=True):
            if sampled >= sample_budget:
                break
            sample.append(doc)
            sampled += size
        put_array(store, f"{work}/verdicts/{index}.npy", verdicts)
    skips["duplicate"] += len(exact)  # all within the cut (exact_shard)
    skips["near_duplicate"] += len(near)
    result.skips = {reason: n for reason, n in sorted(skips.items()) if n}
    result.problems = [reason for reason in result.problems if reason in result.skips]
    result.sample_bytes = sampled
    put_array(store, f"{work}/sample.npy", np.array(sample, dtype=np.uint64))
    return result


def check_kept(data: DataConfig, result: Resolution, store, work: str) -> None:
    """Fail on a corpus with nothing to train on; hold out one document if no other landed in validation."""
    if not result.kept or result.smallest is None:
        reasons = ", ".join(f"{k}={v}" for k, v in sorted(result.skips.items())) or "nothing readable"
        if not result.documents and result.reader_skips:  # not a filter's doing: no file gave a document
            raise DataError(
                f"corpus {data.sources} has no readable document: every input failed to read (skipped: {reasons}); "
                "repair or replace those files (the lines above name them by reason), or point data.sources "
                "at readable text, JSONL or Parquet"
            )
        raise DataError(
            f"corpus {data.sources} has no usable text after cleaning ({result.documents} documents read; "
            f"skipped: {reasons}); point data.sources at text files or lower data.min_chars"
        )
    if result.train == result.kept:
        # Tiny corpora: hold out the document with the smallest content key rather than nothing.
        _, index, place = result.smallest
        verdicts = get_array(store, f"{work}/verdicts/{index}.npy")
        verdicts[place] = VAL
        put_array(store, f"{work}/verdicts/{index}.npy", verdicts)
        result.train -= 1
    if not result.train:
        raise DataError(f"every document landed in validation: lower data.val_fraction ({data.val_fraction})")
