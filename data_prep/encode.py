"""The stages after de-duplication: the tokenizer's sample, encoding (once per partition) and
packing (once per range of shards).

The encode stage of a partition reads the filtered text its scan kept (the sources are read, and
the filters run, once: in the scan), encodes the kept documents and writes, per
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
from data_prep.dedup_stages import DUPLICATE, NEAR_DUPLICATE, PAST_CUT
from data_prep.parallel import WorkerPool
from data_prep.partitions import RECORD_BITS, Partition, get_array
from data_prep.readers import EXAMPLES_PER_REASON
from data_prep.scan import PartitionScan, document_name
from data_prep.shards import ShardInfo, _write_shard
from data_prep.sources import RawFile, relative_names
from data_prep.workers import TRAIN, VAL, batches, encode_batch
from storage import Store

SPLITS = ("train", "val")
DROPPED = {DUPLICATE: "duplicate", NEAR_DUPLICATE: "near_duplicate"}


def sample_texts(store: Store, work: str, partitions: int) -> Iterator[str]:
    """The tokenizer's training sample (``resolve`` chose it), in corpus order, from the scans' text
    (no source is read: the listing is not needed)."""
    sample = get_array(store, f"{work}/sample.npy")
    if not len(sample):
        return
    last = sample[-1]
    for index in range(partitions):
        scan = PartitionScan.load(store, work, index)
        passing = scan.passing()
        chosen = np.isin(passing, sample)
        if not chosen.any():
            continue
        for row, raw in scan.texts():
            if chosen[row]:
                yield raw.decode("utf-8")
            if passing[row] >= last:
                return


def encode_partition(
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
    passing_at = np.flatnonzero(scan.array("codes") == 0)
    passing, places, edits_of = scan.array("docs")[passing_at], scan.array("places"), scan.edits()
    verdicts = get_array(store, f"{work}/verdicts/{part.index}.npy")[passing_at]
    relative = relative_names(files)
    counts: Counter = Counter()
    edits: Counter = Counter()
    examples: dict[str, list[tuple[int, str]]] = {}
    eod = np.asarray([eod_id], dtype=dtype)
    prefix = f"{work}/tokens/{part.index}"

    def name(row: int) -> str:
        return document_name(files[int(passing[row]) >> RECORD_BITS].name, int(places[row]))

    progress = PassProgress(part.name("encode"), int(scan.array("sizes").sum()))

    def kept() -> Iterator[tuple[int, bytes]]:
        for row, raw in scan.texts(progress):
            verdict = int(verdicts[row])
            if verdict in (TRAIN, VAL):
                yield row, raw
            elif verdict in DROPPED:
                placed = examples.setdefault(DROPPED[verdict], [])
                if len(placed) < EXAMPLES_PER_REASON:
                    placed.append((int(passing[row]), name(row)))
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
                for (row, _), (digest, chars, nbytes, ids, fallback) in zip(batch, encoded, strict=True):
                    split = "val" if verdicts[row] == VAL else "train"
                    streams[split].write(ids.astype(dtype, copy=False).tobytes() + eod.tobytes())
                    stats.writerow([relative(name(row)), digest, split, chars, len(ids), fallback])
                    counts[f"{split}_documents"] += 1
                    counts[f"{split}_tokens"] += len(ids) + 1
                    counts["source_bytes"] += nbytes
                    counts["byte_fallback_tokens"] += fallback
                    if split == "val":
                        counts["val_bytes"] += nbytes
                        counts["val_doc_tokens"] += len(ids)
                    edits.update(edits_of.get(row, {}))
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
