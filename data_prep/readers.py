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
DICTIONARY_BATCH_BYTES = 64 * 2**20
"""The most text one batch of a dictionary-encoded column may decode to, each row counted at its largest
dictionary page's size (Arrow writes pages of 1-3 MiB for text: 24-64 rows a batch)."""


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
            plain = pq.ParquetFile(path)
            schema = plain.schema_arrow
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
            meta = plain.metadata
            column = next(i for i in range(meta.num_columns) if meta.schema.column(i).path == text_field)
            largest = _largest_dictionary_page(path, meta, column)
            # A row of a dictionary-encoded page decodes to one dictionary value, at most the dictionary page's
            # size: batches are sized so that even that many rows stay within DICTIONARY_BATCH_BYTES (4,096 rows
            # pointing at one 512 KiB value, 2 GiB of text from a 504-byte file, were decoded 1,024 rows at a time).
            # A header that does not read keeps the text a dictionary instead (slower: plain pages are hashed).
            parquet = plain if largest is not None else pq.ParquetFile(path, read_dictionary=[text_field])
            rows = _batch_rows(meta, column, largest or 0)
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
        except (pa.ArrowException, OSError, StopIteration):
            skips.add("bad_parquet", f"{raw.name}:{row + 1}")


TOO_LONG = object()


def _batch_rows(meta, column: int, dictionary_page: int) -> int:
    """Rows per batch such that a batch's stored text stays near ``PARQUET_BATCH_BYTES``, from the row
    groups' recorded sizes: a few huge values (a 2.5 KB file of 8 rows of 64 MiB each, zstd) are then
    read one at a time, not 1,024 rows at once; and such that rows of dictionary values, each at most
    ``dictionary_page`` bytes, decode to at most ``DICTIONARY_BATCH_BYTES``."""
    groups = [meta.row_group(i) for i in range(meta.num_row_groups)]
    widest = max((g.column(column).total_uncompressed_size / max(1, g.num_rows) for g in groups), default=0.0)
    rows = min(PARQUET_BATCH_ROWS, int(PARQUET_BATCH_BYTES // max(1.0, widest)))
    if dictionary_page:
        rows = min(rows, DICTIONARY_BATCH_BYTES // dictionary_page)
    return max(1, rows)


def _largest_dictionary_page(path: str, meta, column: int) -> int | None:
    """The largest uncompressed dictionary page of the column's chunks (0: none has one), read from each page
    header; None if one does not read as a dictionary page's header."""
    sizes = [0]
    with open(path, "rb") as f:
        for i in range(meta.num_row_groups):
            chunk = meta.row_group(i).column(column)
            if not chunk.has_dictionary_page and {"PLAIN_DICTIONARY", "RLE_DICTIONARY"} & set(chunk.encodings):
                return None  # dictionary-encoded pages with no dictionary page recorded: not a size to trust
            if chunk.has_dictionary_page:
                f.seek(chunk.dictionary_page_offset)
                size = _dictionary_page_size(f.read(64))
                if size is None:
                    return None
                sizes.append(size)
    return max(sizes)


def _dictionary_page_size(header: bytes) -> int | None:
    """``uncompressed_page_size`` of a Parquet page header whose type is DICTIONARY_PAGE (2), else None. The
    header is a Thrift struct in the compact protocol whose first fields are 1: type and 2: uncompressed size,
    both i32: a field header byte (id delta << 4 | 5) then a zigzag varint."""
    at, field, values = 0, 0, {}
    while field < 2:
        if at >= len(header) or header[at] & 0x0F != 5 or not header[at] >> 4:
            return None
        field, at = field + (header[at] >> 4), at + 1
        value, shift = 0, 0
        while True:
            if at >= len(header) or shift > 35:
                return None
            byte, at = header[at], at + 1
            value, shift = value | (byte & 0x7F) << shift, shift + 7
            if not byte & 0x80:
                break
        values[field] = (value >> 1) ^ -(value & 1)
    return values[2] if values.get(1) == 2 and values.get(2, -1) >= 0 else None


def _texts_within(column, cap: int) -> Iterator:
    """The column's values as Python strings, a value longer than ``cap`` characters as ``TOO_LONG`` (never
    made a Python string: its length is read from the Arrow array). A dictionary column (read so when a page
    header did not read) is decoded ``PARQUET_BATCH_BYTES`` of text at a time: its value counts once per row
    that points at it; a plain one is decoded already, within its batch's bound."""
    import pyarrow as pa
    import pyarrow.compute as pc

    if pa.types.is_dictionary(column.type):
        yield from _dictionary_texts(column, cap)
        return
    if column.nbytes <= cap:  # no value can have more characters than the batch has bytes
        yield from column.to_pylist()
        return
    lengths = pc.utf8_length(column)
    longest = pc.max(lengths).as_py()
    if longest is None or longest <= cap:
        yield from column.to_pylist()
        return
    too_long = pc.greater(lengths, cap).to_pylist()
    yield from (TOO_LONG if over else column[i].as_py() for i, over in enumerate(too_long))


def _dictionary_texts(column, cap: int) -> Iterator:
    import numpy as np
    import pyarrow.compute as pc

    chars = pc.take(pc.utf8_length(column.dictionary), column.indices)
    size = pc.take(pc.binary_length(column.dictionary), column.indices)
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
        yield from column.slice(start, stop - start).dictionary_decode().to_pylist()  # its to_pylist is 5x slower
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
