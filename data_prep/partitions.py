"""The corpus listing cut into partitions, and the ids and work files every stage shares.

A partition is a contiguous range of the listing's files. Each stage that reads the corpus
(scan, encode) runs once per partition, each in its own process (a Flyte map task's pod on a
cluster), and writes what it found to the store under the run's work prefix. Nothing a stage
decides depends on the cut: a document is named by its **document id**, ``file index << 32 |
record index`` in the whole listing, and every global decision (which copy of a duplicate is
kept, which documents train the tokenizer, where a shard starts) is taken in document-id
order. So the same corpus and config give the same dataset at any partition count.
"""

from __future__ import annotations

import hashlib
import io
import json
from dataclasses import dataclass

import numpy as np

from data_prep.errors import DataError
from data_prep.sources import RawFile
from storage import Store

PARTITION_BYTES = 256 << 20
"""Listed bytes a partition gets when ``data.partitions`` is 0: a scan or encode task then holds
at most one partition's per-document records (about 300 bytes a document) whatever the corpus."""
RECORD_BITS = 32
MAX_RECORDS = 1 << RECORD_BITS


@dataclass(frozen=True)
class Partition:
    """Files ``[first_file, end_file)`` of the listing."""

    index: int
    first_file: int
    end_file: int
    of: int = 1
    """How many partitions the listing has."""

    def name(self, stage: str) -> str:
        """The stage's name in progress lines: ``scan``, or ``scan 2/4``."""
        return stage if self.of == 1 else f"{stage} {self.index + 1}/{self.of}"


def partition_count(files: list[RawFile], requested: int) -> int:
    """``requested``, or one a ``PARTITION_BYTES`` of listing; never more than there are files."""
    total = sum(f.size for f in files)
    count = requested or -(-total // PARTITION_BYTES)
    return max(1, min(count, len(files)))


def cut(files: list[RawFile], requested: int) -> list[Partition]:
    """Contiguous file ranges of about equal bytes, none empty."""
    count = partition_count(files, requested)
    ends = np.cumsum([f.size for f in files], dtype=np.int64)
    total = int(ends[-1]) if len(ends) else 0
    bounds = [0]
    for i in range(1, count):
        target = total * i / count
        # The file boundary nearest the target: after file ``at - 1``, whose end is ``ends[at - 1]``.
        at = int(np.searchsorted(ends, target, side="left")) + 1
        if at > 1 and target - ends[at - 2] <= ends[at - 1] - target:
            at -= 1
        # Room for every later partition to hold at least one file.
        bounds.append(min(max(at, bounds[-1] + 1), len(files) - (count - i)))
    bounds.append(len(files))
    return [Partition(i, lo, hi, count) for i, (lo, hi) in enumerate(zip(bounds, bounds[1:], strict=False))]


def doc_id(file_index: int, record: int, name: str) -> int:
    if record >= MAX_RECORDS:
        raise DataError(f"{name} holds more than {MAX_RECORDS:,} documents: split it into smaller files")
    return file_index << RECORD_BITS | record


def run_key(*parts: object) -> str:
    """A name for one preparation's work files: a hash of everything that shapes them."""
    return hashlib.sha256(json.dumps(parts, sort_keys=True, default=str).encode()).hexdigest()[:16]


def work_prefix(key: str) -> str:
    """Beside the datasets, uncommitted: ``pretrain gc`` removes a crashed run's once it is an hour old."""
    return f"datasets/work-{key}"


def put_array(store: Store, key: str, array: np.ndarray) -> None:
    buffer = io.BytesIO()
    np.save(buffer, np.ascontiguousarray(array), allow_pickle=False)
    store.put_bytes(key, buffer.getvalue())


def get_array(store: Store, key: str) -> np.ndarray:
    return np.load(io.BytesIO(store.get_bytes(key)), allow_pickle=False)
