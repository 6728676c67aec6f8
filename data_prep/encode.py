"""The stages after de-duplication: the tokenizer's sample, encoding (once per partition) and
packing (once per range of shards).

The encode stage of a partition reads its documents again, encodes the kept ones and writes, per
split, their token stream (each document's ids then ``<|endoftext|>``) to
``<work>/tokens/<index>/<split>.bin``, with its rows of the doc stats and its counts. A split's
stream over the whole corpus is the partitions' streams end to end, so shard ``k`` is the
slice ``[k × per_shard × row, (k + 1) × per_shard × row)`` of it whichever partitions hold it:
each pack task reads just those byte ranges (``Store.get_range``), writes its shards and
uploads each as it is written.
"""

from __future__ import annotations

import csv
import tempfile
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import numpy as np

from common.errors import local_space
from data_prep.config import DataConfig
from data_prep.console import PassProgress
from data_prep.dedup import digest_key
from data_prep.dedup_stages import DUPLICATE, NEAR_DUPLICATE, PAST_CUT
from data_prep.parallel import WorkerPool
from data_prep.partitions import Partition, get_array
from data_prep.readers import EXAMPLES_PER_REASON
from data_prep.scan import PartitionScan, PositionedSkips, partition_documents
from data_prep.shards import ShardInfo, _write_shard
from data_prep.sources import DataError, RawFile, relative_names
from data_prep.workers import TRAIN, VAL, batches, encode_batch, filtered_batch
from storage import Store

SPLITS = ("train", "val")
DROPPED = {DUPLICATE: "duplicate", NEAR_DUPLICATE: "near_duplicate"}


def _again(
    data: DataConfig, files: list[RawFile], part: Partition, scan: PartitionScan, progress: PassProgress
) -> Iterator[tuple[int, int, object]]:
    """The partition's documents read again, with their place in the scan, checked to be the same
    documents the scan read (same ids in the same order), up to the last one it read."""
    docs = scan.array("docs")
    place = 0
    for docid, doc in partition_documents(data, files, part, PositionedSkips(), progress):
        if place == len(docs):
            break
        if docid != docs[place]:
            raise DataError(
                f"{doc.source} changed while the dataset was being prepared (its documents differ from the scan's): "
                "rerun once the sources are stable"
            )
        yield place, docid, doc
        place += 1
    if place < len(docs):
        raise DataError(
            f"the sources {data.sources} yielded {place:,} of the {len(docs):,} documents the scan read: "
            "rerun once they are stable"
        )


def _progress(files: list[RawFile], part: Partition, stage: str) -> PassProgress:
    return PassProgress(part.name(stage), sum(f.size for f in files[part.first_file : part.end_file]))


def sample_texts(
    data: DataConfig, files: list[RawFile], parts: list[Partition], store: Store, work: str, pool: WorkerPool
) -> Iterator[str]:
    """The tokenizer's training sample (``resolve`` chose it), read again, in corpus order."""
    sample = get_array(store, f"{work}/sample.npy")
    if not len(sample):
        return
    last = sample[-1]

    def chosen() -> Iterator[tuple[int, object]]:
        for part in parts:
            scan = PartitionScan.load(store, work, part.index)
            docs = scan.array("docs")
            if not len(docs) or not np.isin(docs, sample).any():
                continue
            wanted = set(docs[np.isin(docs, sample)].tolist())
            for _, docid, doc in _again(data, files, part, scan, _progress(files, part, "sample")):
                if docid in wanted:
                    yield docid, doc
                if docid >= last:
                    return

    for _, texts in pool.map_ordered(filtered_batch, batches(chosen())):
        yield from texts


def encode_partition(
    data: DataConfig,
    files: list[RawFile],
    part: Partition,
    store: Store,
    work: str,
    pool: WorkerPool,
    eod_id: int,
    dtype: np.dtype,
) -> None:
    """Encode one partition's kept documents into ``<work>/tokens/<index>/`` and ``<work>/encoded/<index>.json``."""
    scan = PartitionScan.load(store, work, part.index)
    verdicts = get_array(store, f"{work}/verdicts/{part.index}.npy")
    keys = dict(zip(scan.passing().tolist(), scan.array("keys").tolist(), strict=True))
    relative = relative_names(files)
    counts: Counter = Counter()
    edits: Counter = Counter()
    examples: dict[str, list[tuple[int, str]]] = {}
    eod = np.asarray([eod_id], dtype=dtype)
    prefix = f"{work}/tokens/{part.index}"

    split_of: dict[int, str] = {}  # of the documents in flight
    progress = _progress(files, part, "encode")

    def kept() -> Iterator[tuple[int, object]]:
        for place, docid, doc in _again(data, files, part, scan, progress):
            verdict = int(verdicts[place])
            if verdict in (TRAIN, VAL):
                split_of[docid] = "val" if verdict == VAL else "train"
                yield docid, doc
            elif verdict in DROPPED:
                placed = examples.setdefault(DROPPED[verdict], [])
                if len(placed) < EXAMPLES_PER_REASON:
                    placed.append((docid, doc.source))
            elif verdict == PAST_CUT:
                return

    with tempfile.TemporaryDirectory(prefix="pretrain-encode-") as tmp, local_space(tmp, "a partition's token stream"):
        folder = Path(tmp)
        streams = {split: open(folder / f"{split}.bin", "wb") for split in SPLITS}
        rows = open(folder / "docstats.csv", "w", newline="")
        stats = csv.writer(rows)
        try:
            for batch, encoded in pool.map_ordered(encode_batch, batches(kept())):
                progress.add_documents(len(batch))
                for (docid, doc), (digest, chars, nbytes, ids, fallback, doc_edits) in zip(batch, encoded, strict=True):
                    if digest_key(bytes.fromhex(digest)) != keys[docid]:
                        raise DataError(
                            f"{doc.source} changed while the dataset was being prepared (its content differs from the scan): "
                            "rerun once the sources are stable"
                        )
                    split = split_of.pop(docid)
                    streams[split].write(ids.astype(dtype, copy=False).tobytes() + eod.tobytes())
                    stats.writerow([relative(doc.source), digest, split, chars, len(ids), fallback])
                    counts[f"{split}_documents"] += 1
                    counts[f"{split}_tokens"] += len(ids) + 1
                    counts["source_bytes"] += nbytes
                    counts["byte_fallback_tokens"] += fallback
                    if split == "val":
                        counts["val_bytes"] += nbytes
                        counts["val_doc_tokens"] += len(ids)
                    edits.update(doc_edits)
        finally:
            for stream in [*streams.values(), rows]:
                stream.close()
        progress.finish()
        for split in SPLITS:
            store.put_file(f"{prefix}/{split}.bin", folder / f"{split}.bin")
        store.put_file(f"{work}/docstats/{part.index}.csv", folder / "docstats.csv")
    store.put_json(f"{work}/encoded/{part.index}.json", {"counts": dict(counts), "edits": dict(edits), "examples": examples})


def split_layout(store: Store, work: str, parts: int, data: DataConfig, split: str) -> tuple[list[int], int]:
    """The tokens of each partition's stream of ``split``, and how many shards they pack into."""
    tokens = [int(store.get_json(f"{work}/encoded/{i}.json")["counts"].get(f"{split}_tokens", 0)) for i in range(parts)]
    row, per_shard = data.seq_len + 1, data.sequences_per_sample * data.samples_per_shard
    rows = sum(tokens) // row
    return tokens, -(-rows // per_shard)


def pack_shards(
    store: Store, work: str, parts: int, data: DataConfig, split: str, first: int, end: int, dtype: np.dtype
) -> list[ShardInfo]:
    """Shards ``[first, end)`` of ``split``, each uploaded to ``<work>/shards/`` as soon as it is written."""
    tokens, _ = split_layout(store, work, parts, data, split)
    starts = np.concatenate([[0], np.cumsum(tokens)])
    row, per_shard = data.seq_len + 1, data.sequences_per_sample * data.samples_per_shard
    usable = int(starts[-1]) // row * row  # the tail shorter than a row is dropped
    infos = []
    with tempfile.TemporaryDirectory(prefix="pretrain-pack-") as tmp, local_space(tmp, "a shard being written"):
        for index in range(first, end):
            lo, hi = index * per_shard * row, min((index + 1) * per_shard * row, usable)
            pieces = []
            for part in range(np.searchsorted(starts, lo, side="right") - 1, parts):
                if starts[part] >= hi:
                    break
                a, b = max(lo, starts[part]) - starts[part], min(hi, starts[part + 1]) - starts[part]
                if b > a:
                    data_bytes = store.get_range(
                        f"{work}/tokens/{part}/{split}.bin", int(a) * dtype.itemsize, int(b) * dtype.itemsize
                    )
                    pieces.append(np.frombuffer(data_bytes, dtype=dtype))
            chunk = np.concatenate(pieces).reshape(-1, row)
            info = _write_shard(chunk, Path(tmp), split, index, data.sequences_per_sample)
            store.put_file(f"{work}/shards/{info.name}", Path(tmp) / info.name)
            (Path(tmp) / info.name).unlink()
            infos.append(info)
    return infos
