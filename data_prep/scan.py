"""The scan stage, once per partition: read, clean and filter every document of the partition's
files, and write to the run's work prefix what de-duplication and the later stages need of each.

Per partition, under ``<work>/scan/<index>/``:

- ``docs.npy`` the id of every document read (``partitions.doc_id``), ``codes.npy`` its filter
  verdict (0: passes; else 1 + an index into the summary's ``reasons``);
- for the documents that pass, in order: ``keys.npy`` (content key), ``splits.npy``,
  ``sizes.npy`` (UTF-8 bytes of the filtered text) and ``near.npy`` (LSH band keys and sketch);
- ``events.npy`` the readers' skips (a bad file or record) as (position, reason, count), the
  position being the id of the next document read, so that a global cut can count only those
  before it; ``summary.json`` the reasons, a few example names per reason with their position,
  which reasons are problems and what the first of each said.

With ``data.max_documents`` a partition stops after that many documents pass its filters: no
document after it can be among the first ``max_documents`` that pass in the whole corpus.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from itertools import count

import numpy as np

from data_prep.config import DataConfig
from data_prep.console import PassProgress
from data_prep.parallel import WorkerPool
from data_prep.partitions import RECORD_BITS, Partition, doc_id, get_array, put_array
from data_prep.readers import EXAMPLES_PER_REASON, Skips, read_file
from data_prep.sources import RawFile
from data_prep.workers import batches, scan_batch
from storage import Store


def max_doc_bytes(data: DataConfig) -> int:
    """Raw bytes past which a document cannot clean down to ``max_chars`` (UTF-8: ≤ 4 bytes a character)."""
    return 4 * data.max_chars + 4


class PositionedSkips(Skips):
    """Skips that also remember where in the corpus each happened (the id of the next document)."""

    def __init__(self) -> None:
        super().__init__()
        self.position = 0
        self.events: list[tuple[int, str, int]] = []
        self.placed_examples: dict[str, list[tuple[int, str]]] = {}

    def add(self, reason: str, name: str, n: int = 1, problem: bool = True, detail: str = "") -> None:
        super().add(reason, name, n, problem, detail)
        self.events.append((self.position, reason, n))
        self.example(reason, self.position, name)

    def example(self, reason: str, position: int, name: str) -> None:
        examples = self.placed_examples.setdefault(reason, [])
        if len(examples) < EXAMPLES_PER_REASON:
            examples.append((position, name))


@dataclass
class _Found:
    """What the scan of one partition accumulates, per document."""

    docs: list[int] = field(default_factory=list)
    codes: list[int] = field(default_factory=list)
    keys: list[np.ndarray] = field(default_factory=list)
    near: list[np.ndarray] = field(default_factory=list)
    splits: list[int] = field(default_factory=list)
    sizes: list[int] = field(default_factory=list)


def partition_documents(data: DataConfig, files: list[RawFile], part: Partition, skips: PositionedSkips, progress: PassProgress):
    for index, raw in zip(count(part.first_file), progress.files(files[part.first_file : part.end_file]), strict=False):
        record = 0
        skips.position = index << RECORD_BITS
        for doc in read_file(raw, data.text_field, max_doc_bytes(data), skips):
            yield doc_id(index, record, raw.name), doc
            record += 1
            skips.position = index << RECORD_BITS | record


def scan_partition(data: DataConfig, files: list[RawFile], part: Partition, store: Store, work: str, pool: WorkerPool) -> int:
    """Scan one partition into ``<work>/scan/<index>/``; the number of documents read."""
    skips, found, reasons = PositionedSkips(), _Found(), {}
    progress = PassProgress(part.name("scan"), sum(f.size for f in files[part.first_file : part.end_file]))
    passing, stop = 0, data.max_documents or -1
    for batch, (verdicts, keys, rows, splits, sizes) in pool.map_ordered(
        scan_batch, batches(partition_documents(data, files, part, skips, progress))
    ):
        progress.add_documents(len(batch))
        taken = []
        for at, ((docid, doc), reason) in enumerate(zip(batch, verdicts, strict=True)):
            found.docs.append(docid)
            if reason:
                found.codes.append(1 + reasons.setdefault(reason, len(reasons)))
                skips.example(reason, docid, doc.source)  # counted from the codes: filtering, not a problem
                continue
            found.codes.append(0)
            taken.append(at)
            passing += 1
            if passing == stop:
                break
        found.keys.append(keys[taken])
        found.splits += [splits[i] for i in taken]
        found.sizes += [sizes[i] for i in taken]
        if rows is not None:
            found.near.append(rows[taken])
        if passing == stop:
            break
    progress.finish()
    _write(data, store, f"{work}/scan/{part.index}", found, reasons, skips)
    return len(found.docs)


def _write(data: DataConfig, store: Store, prefix: str, found: _Found, reasons: dict[str, int], skips: PositionedSkips) -> None:
    put_array(store, f"{prefix}/docs.npy", np.array(found.docs, dtype=np.uint64))
    put_array(store, f"{prefix}/codes.npy", np.array(found.codes, dtype=np.uint8 if len(reasons) < 255 else np.uint16))
    put_array(store, f"{prefix}/keys.npy", np.concatenate([np.zeros(0, np.uint64), *found.keys]))
    put_array(store, f"{prefix}/splits.npy", np.array(found.splits, dtype=np.uint8))
    put_array(store, f"{prefix}/sizes.npy", np.array(found.sizes, dtype=np.int64))
    if data.near_dedup:
        width = found.near[0].shape[1] if found.near else 1
        put_array(store, f"{prefix}/near.npy", np.concatenate([np.zeros((0, width), np.uint64), *found.near]))
    # Reader skips: (position, reason index, count); their reasons share the filters' table.
    events = [(position, reasons.setdefault(reason, len(reasons)), n) for position, reason, n in skips.events]
    put_array(store, f"{prefix}/events.npy", np.array(events, dtype=np.uint64).reshape(-1, 3))
    store.put_json(
        f"{prefix}/summary.json",
        {
            "reasons": list(reasons),
            "examples": skips.placed_examples,
            "problems": sorted(skips.problems),
            "details": skips.details,
        },
    )


@dataclass
class PartitionScan:
    """One partition's scan, read back from the store."""

    store: Store
    prefix: str
    reasons: list[str]
    examples: dict[str, list[tuple[int, str]]]
    problems: list[str]
    details: dict[str, str]

    @classmethod
    def load(cls, store: Store, work: str, index: int) -> PartitionScan:
        prefix = f"{work}/scan/{index}"
        summary = store.get_json(f"{prefix}/summary.json")
        examples = {reason: [(int(p), n) for p, n in pairs] for reason, pairs in summary["examples"].items()}
        return cls(store, prefix, summary["reasons"], examples, summary["problems"], summary["details"])

    def array(self, name: str) -> np.ndarray:
        return get_array(self.store, f"{self.prefix}/{name}.npy")

    def passing(self) -> np.ndarray:
        """The ids of the documents that passed the filters: the rows of ``keys``, ``splits``, ``sizes``, ``near``."""
        return self.array("docs")[self.array("codes") == 0]
