"""The scan stage, once per partition: read, clean and filter every document of the partition's
files, and write to the run's work prefix what de-duplication and the later stages need of each.

Per partition, under ``<work>/scan/<index>/``:

- ``docs.npy`` the id of every document read (``partitions.doc_id``), ``codes.npy`` its filter
  verdict (0: passes; else 1 + an index into the summary's ``reasons``);
- for the documents that pass, in order: ``keys.npy`` (content key), ``splits.npy``,
  ``sizes.npy`` (UTF-8 bytes of the filtered text), ``near.npy`` (LSH band keys and sketch),
  ``places.npy`` (the line or row in its file, -1 for a whole-file document: its name in the doc
  stats), ``edits.json`` (the filters' edits, by row, for the rows with any) and ``text.bin``
  (the filtered texts end to end, UTF-8: ``sizes`` cut it). The later stages train the
  tokenizer on and encode that text: no stage reads the sources or runs the filters again;
- ``events.npy`` the readers' skips (a bad file or record) as (position, reason, count), the
  position being the id of the next document read, so that a global cut can count only those
  before it; ``summary.json`` the reasons, a few example names per reason with their position,
  which reasons are problems and what the first of each said.

With ``data.max_documents`` a partition stops after that many documents pass its filters: no
document after it can be among the first ``max_documents`` that pass in the whole corpus.
"""

from __future__ import annotations

import tempfile
from collections.abc import Iterator
from dataclasses import dataclass, field
from itertools import count
from pathlib import Path

import numpy as np

from common.errors import local_space
from data_prep.config import DataConfig
from data_prep.console import PassProgress
from data_prep.parallel import WorkerPool
from data_prep.partitions import RECORD_BITS, Partition, doc_id, get_array, put_array
from data_prep.readers import EXAMPLES_PER_REASON, Skips, read_file
from data_prep.sources import RawFile
from data_prep.workers import batches, scan_batch
from storage import Store

TEXT_CHUNK = 4 << 20


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
    places: list[int] = field(default_factory=list)
    edits: dict[int, dict[str, int]] = field(default_factory=dict)


def place_in_file(source: str, file_name: str) -> int:
    """A document's line or row in its file (``name:line``), or -1 for a whole-file document."""
    return -1 if source == file_name else int(source[len(file_name) + 1 :])


def document_name(file_name: str, place: int) -> str:
    """``place_in_file`` undone: the document's name as its reader gave it."""
    return file_name if place < 0 else f"{file_name}:{place}"


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
    with tempfile.TemporaryDirectory(prefix="pretrain-scan-") as tmp, local_space(tmp, "a partition's filtered text"):
        text_path = Path(tmp) / "text.bin"
        with open(text_path, "wb") as text:
            for batch, result in pool.map_ordered(scan_batch, batches(partition_documents(data, files, part, skips, progress))):
                progress.add_documents(len(batch))
                taken = []
                for at, ((docid, doc), reason) in enumerate(zip(batch, result.reasons, strict=True)):
                    found.docs.append(docid)
                    if reason:
                        found.codes.append(1 + reasons.setdefault(reason, len(reasons)))
                        skips.example(reason, docid, doc.source)  # counted from the codes: filtering, not a problem
                        continue
                    found.codes.append(0)
                    if result.edits[at]:
                        found.edits[len(found.sizes) + len(taken)] = result.edits[at]
                    taken.append(at)
                    found.places.append(place_in_file(doc.source, files[docid >> RECORD_BITS].name))
                    text.write(result.texts[at])
                    passing += 1
                    if passing == stop:
                        break
                found.keys.append(result.keys[taken])
                found.splits += [result.splits[i] for i in taken]
                found.sizes += [len(result.texts[i]) for i in taken]
                if result.rows is not None:
                    found.near.append(result.rows[taken])
                if passing == stop:
                    break
        progress.finish()
        store.put_file(f"{work}/scan/{part.index}/text.bin", text_path)
    _write(data, store, f"{work}/scan/{part.index}", found, reasons, skips)
    return len(found.docs)


def _write(data: DataConfig, store: Store, prefix: str, found: _Found, reasons: dict[str, int], skips: PositionedSkips) -> None:
    put_array(store, f"{prefix}/docs.npy", np.array(found.docs, dtype=np.uint64))
    put_array(store, f"{prefix}/codes.npy", np.array(found.codes, dtype=np.uint8 if len(reasons) < 255 else np.uint16))
    put_array(store, f"{prefix}/keys.npy", np.concatenate([np.zeros(0, np.uint64), *found.keys]))
    put_array(store, f"{prefix}/splits.npy", np.array(found.splits, dtype=np.uint8))
    put_array(store, f"{prefix}/sizes.npy", np.array(found.sizes, dtype=np.int64))
    put_array(store, f"{prefix}/places.npy", np.array(found.places, dtype=np.int64))
    store.put_json(f"{prefix}/edits.json", {str(row): edits for row, edits in found.edits.items()})
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

    def edits(self) -> dict[int, dict[str, int]]:
        """The filters' edits of the passing documents, by row (only rows with any)."""
        return {int(row): edits for row, edits in self.store.get_json(f"{self.prefix}/edits.json").items()}

    def texts(self, progress: PassProgress | None = None) -> Iterator[tuple[int, bytes]]:
        """(row, filtered text) of every passing document, in order, streamed from ``text.bin``."""
        key = f"{self.prefix}/text.bin"
        buffer, at = b"", 0
        with self.store.open_read(key) as stream:
            for row, size in enumerate(self.array("sizes").tolist()):
                while len(buffer) - at < size:  # whole chunks: a network stream's small reads are slow
                    more = stream.read(max(TEXT_CHUNK, size))
                    if not more:
                        raise OSError(f"{self.store.url(key)} ended early: the scan's text is incomplete; rerun the preparation")
                    buffer, at = buffer[at:] + more, 0
                if progress is not None:
                    progress.read(size)
                yield row, buffer[at : at + size]
                at += size
