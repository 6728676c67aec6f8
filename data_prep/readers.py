"""Stream documents out of listed files: plain text, JSONL and Parquet, compressed or not.

Nothing here holds more than one document (capped by ``max_doc_bytes``) or one Parquet
batch in memory (sized from the row groups' recorded bytes, so a huge value is decoded alone and never
made a Python string when it is over the cap): a file or JSONL line that outgrows the cap is abandoned while streaming
and counted as ``too_long``. Every input that does not become a document is counted in
``Skips`` by reason, with the first few names kept as examples (and summarised by the prepare step).
"""

from __future__ import annotations

import json
import shutil
import tempfile
from collections import Counter
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from itertools import chain

from data_prep.formats import compression_of, decompressed, kind_of, stream_errors
from data_prep.sources import ChangedSinceListing, Document, RawFile

CHUNK = 1 << 20
SNIFF = 8192
EXAMPLES_PER_REASON = 3
PARQUET_BATCH_ROWS = 1024
PARQUET_BATCH_BYTES = 16 * 2**20
"""About the most decoded text one Parquet batch holds (one larger value is read alone)."""


class Skips:
    """Counts of skipped inputs by reason, with a few example names per reason.

    Nothing is logged per input: a corpus with a million bad records would print a million
    lines. The prepare step logs one summary at the end of its scan (``console.skip_summary``).
    """

    def __init__(self) -> None:
        self.counts: Counter = Counter()
        self.examples: dict[str, list[str]] = {}
        self.problems: set[str] = set()
        """Reasons that are problem inputs (a broken file), not mere filtering (a duplicate)."""
        self.details: dict[str, str] = {}
        """Per reason, what the first such input said about itself (a Parquet file's columns)."""

    def add(self, reason: str, name: str, n: int = 1, problem: bool = True, detail: str = "") -> None:
        """Count ``n`` skips; ``problem`` inputs are reported as warnings, filtering as information."""
        self.counts[reason] += n
        if problem:
            self.problems.add(reason)
        if detail:
            self.details.setdefault(reason, detail)
        examples = self.examples.setdefault(reason, [])
        if len(examples) < EXAMPLES_PER_REASON:
            examples.append(name)


class _Broken(Exception):
    """The stream under a reader failed; ``reason`` says how."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


def _chunks(stream, compression: str) -> Iterator[bytes]:
    errors = stream_errors(compression)
    reason = {"gzip": "bad_gzip", "zstd": "bad_zstd"}.get(compression, "unreadable")
    while True:
        try:
            chunk = stream.read(CHUNK)
        except errors as e:
            raise _Broken(reason) from e
        if not chunk:
            return
        yield chunk


def _bounded_lines(chunks: Iterable[bytes], cap: int) -> Iterator[bytes | None]:
    """Lines without their newline; ``None`` for a line longer than ``cap`` bytes, which is
    dropped while it streams past rather than held."""
    parts: list[bytes] = []
    size, over = 0, False
    for chunk in chunks:
        pos = 0
        while True:
            nl = chunk.find(b"\n", pos)
            end = len(chunk) if nl < 0 else nl
            if not over:
                size += end - pos
                if size > cap:
                    over, parts = True, []
                else:
                    parts.append(chunk[pos:end])
            if nl < 0:
                break
            yield None if over else b"".join(parts)
            parts, size, over = [], 0, False
            pos = nl + 1
    if over or size:
        yield None if over else b"".join(parts)


def _text_document(raw: RawFile, chunks: Iterator[bytes], cap: int, skips: Skips) -> Iterator[Document]:
    parts, size = [], 0
    for chunk in chunks:
        size += len(chunk)
        if size > cap:
            skips.add("too_long", raw.name)
            return
        parts.append(chunk)
    try:
        text = b"".join(parts).decode("utf-8")
    except UnicodeDecodeError:
        skips.add("not_utf8", raw.name)
        return
    yield Document(raw.name, text.removeprefix("\ufeff"))


def _jsonl_documents(raw: RawFile, chunks: Iterator[bytes], text_field: str, cap: int, skips: Skips) -> Iterator[Document]:
    # JSON escapes inflate text up to 6 bytes a character (\uXXXX): allow for them in the cap.
    for lineno, line in enumerate(_bounded_lines(chunks, 6 * cap + 65536), start=1):
        where = f"{raw.name}:{lineno}"
        if line is None:
            skips.add("too_long", where)
            continue
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except (ValueError, RecursionError):  # JSONDecodeError and UnicodeDecodeError are ValueErrors
            skips.add("bad_jsonl_record", where)
            continue
        text = record.get(text_field) if isinstance(record, dict) else None
        if not isinstance(text, str):
            skips.add("jsonl_missing_text_field", where)
            continue
        yield Document(where, text)


@contextmanager
def _seekable_path(raw: RawFile):
    """A path for ``raw`` that Arrow reads natively: a local file is opened once, as its listing saw it
    (``open_listed``), and read through its descriptor's ``/dev/fd`` name (the same file, whatever its path
    names now); remote Parquet is spooled to a temporary file (its footer is at the end, so it cannot be streamed
    front to back)."""
    if raw.local_path:
        with raw.open() as f:
            yield f"/dev/fd/{f.fileno()}"
        return
    with tempfile.NamedTemporaryFile(prefix="pretrain-parquet-", suffix=".parquet") as tmp:
        with raw.open() as src:
            shutil.copyfileobj(src, tmp, CHUNK)
        tmp.flush()
        yield tmp.name


def _parquet_documents(raw: RawFile, text_field: str, cap: int, skips: Skips) -> Iterator[Document]:
    import pyarrow as pa
    import pyarrow.parquet as pq

    with _seekable_path(raw) as path:
        try:
            schema = pq.ParquetFile(path).schema_arrow
        except (pa.ArrowException, OSError):
            skips.add("bad_parquet", raw.name)
            return
        if text_field not in schema.names:
            detail = f"{raw.name} has the columns {', '.join(schema.names)}, not {text_field!r}: set data.text_field"
            skips.add("parquet_missing_text_field", raw.name, detail=detail)
            return
        field = schema.field(text_field).type
        value_type = field.value_type if pa.types.is_dictionary(field) else field
        if not (pa.types.is_string(value_type) or pa.types.is_large_string(value_type)):
            skips.add("parquet_text_not_string", raw.name)
            return
        row = 0
        try:
            # Dictionary-encoded text stays a dictionary (indices into distinct values): expanded by Arrow, 4,096
            # rows pointing at one 512 KiB value were 2 GiB of text from a 280-byte file.
            parquet = pq.ParquetFile(path, read_dictionary=[text_field])
            rows = _batch_rows(parquet, schema.get_field_index(text_field))
            for batch in parquet.iter_batches(batch_size=rows, columns=[text_field]):
                for text in _texts_within(batch.column(0), cap):
                    row += 1
                    where = f"{raw.name}:{row}"
                    if text is None:
                        skips.add("parquet_null_text", where)
                    elif text is TOO_LONG:
                        skips.add("too_long", where)
                    else:
                        yield Document(where, text)
        except (pa.ArrowException, OSError):
            skips.add("bad_parquet", f"{raw.name}:{row + 1}")


TOO_LONG = object()


def _batch_rows(parquet, column: int) -> int:
    """Rows per batch such that a batch's stored text stays near ``PARQUET_BATCH_BYTES``, from the row
    groups' recorded sizes: a few huge values (a 2.5 KB file of 8 rows of 64 MiB each, zstd) are then
    read one at a time, not 1,024 rows at once. (What a batch decodes to is bounded by ``_texts_within``.)"""
    meta = parquet.metadata
    groups = [meta.row_group(i) for i in range(meta.num_row_groups)]
    widest = max((g.column(column).total_uncompressed_size / max(1, g.num_rows) for g in groups), default=0.0)
    return max(1, min(PARQUET_BATCH_ROWS, int(PARQUET_BATCH_BYTES // max(1.0, widest))))


def _texts_within(column, cap: int) -> Iterator:
    """The column's values as Python strings, a value longer than ``cap`` characters as ``TOO_LONG`` (never
    made a Python string: its length is read from the Arrow array), made ``PARQUET_BATCH_BYTES`` of decoded
    text at a time whatever the encoding (a dictionary's value counts once per row that points at it)."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.compute as pc

    if pa.types.is_dictionary(column.type):
        index = column.indices
        chars = pc.take(pc.utf8_length(column.dictionary), index)
        size = pc.take(pc.binary_length(column.dictionary), index)
    else:
        chars, size = pc.utf8_length(column), pc.binary_length(column)
    too_long = pc.fill_null(pc.greater(chars, cap), False).to_numpy(zero_copy_only=False)
    size = np.where(too_long, 0, pc.fill_null(size, 0).to_numpy(zero_copy_only=False))
    start, n = 0, len(column)
    while start < n:
        if too_long[start]:
            yield TOO_LONG
            start += 1
            continue
        # The longest run from ``start`` of rows within the cap whose text adds up to the budget (one row at least).
        ends = np.cumsum(size[start:]) > PARQUET_BATCH_BYTES
        stop = start + max(1, int(np.argmax(ends)) if ends.any() else n - start)
        cut = np.flatnonzero(too_long[start:stop])
        stop = start + int(cut[0]) if len(cut) else stop
        yield from column.slice(start, stop - start).to_pylist()
        start = stop


def read_file(raw: RawFile, text_field: str, max_doc_bytes: int, skips: Skips) -> Iterator[Document]:
    """The documents of one file; problems become counted skips, never exceptions."""
    if raw.problem:
        skips.add(raw.problem, raw.name)
        return
    kind = kind_of(raw.name, explicit=True)
    if not kind:
        skips.add("unsupported_format", raw.name)
        return
    if kind == "parquet":
        try:
            yield from _parquet_documents(raw, text_field, max_doc_bytes, skips)
        except ChangedSinceListing:
            skips.add("changed_since_listing", raw.name)
        except OSError:
            skips.add("unreadable", raw.name)
        return
    compression = compression_of(raw.name)
    try:
        stream = decompressed(raw.open(), compression)
    except ChangedSinceListing:
        skips.add("changed_since_listing", raw.name)
        return
    except OSError:
        skips.add("unreadable", raw.name)
        return
    try:
        chunks = _chunks(stream, compression)
        first = next(chunks, b"")
        if b"\x00" in first[:SNIFF]:
            skips.add("binary", raw.name)
            return
        chunks = chain([first], chunks)
        if kind == "jsonl":
            yield from _jsonl_documents(raw, chunks, text_field, max_doc_bytes, skips)
        else:
            yield from _text_document(raw, chunks, max_doc_bytes, skips)
    except _Broken as broken:
        skips.add(broken.reason, raw.name)
    except OSError:
        skips.add("unreadable", raw.name)
    finally:
        stream.close()


def iter_documents(files: Iterable[RawFile], text_field: str, max_doc_bytes: int, skips: Skips) -> Iterator[Document]:
    """Documents of every file, in listing order."""
    for raw in files:
        yield from read_file(raw, text_field, max_doc_bytes, skips)
