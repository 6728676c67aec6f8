"""Packed sequences in WebDataset shards: writing, and reading back.

A sample holds ``sequences_per_sample`` rows of ``seq_len + 1`` token ids as one ``.npy``
array (inputs are ``row[:-1]``, labels ``row[1:]``). Documents are concatenated, each
followed by the end-of-document id, and cut into rows; the tail shorter than a row is
dropped.
"""

from __future__ import annotations

import functools
import hashlib
import io
import tarfile
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from data_prep.errors import DataError
from storage import open_store

TOKENS = "tokens.npy"  # the one member of every sample


@dataclass
class ShardInfo:
    name: str
    bytes: int
    sha256: str
    sequences: int
    tokens: int


def token_dtype(vocab_size: int) -> np.dtype:
    return np.dtype(np.uint16) if vocab_size <= 65536 else np.dtype(np.int32)


def pack(docs: Sequence[np.ndarray], eod_id: int, seq_len: int, dtype: np.dtype) -> np.ndarray:
    """Rows of ``seq_len + 1`` ids from the documents, each followed by ``eod_id``."""
    if not docs:
        return np.zeros((0, seq_len + 1), dtype=dtype)
    eod = np.asarray([eod_id], dtype=np.int64)
    stream = np.concatenate([part for ids in docs for part in (ids.astype(np.int64), eod)])
    rows = len(stream) // (seq_len + 1)
    return stream[: rows * (seq_len + 1)].reshape(rows, seq_len + 1).astype(dtype)


def _write_shard(chunk: np.ndarray, out_dir: Path, split: str, shard_idx: int, sequences_per_sample: int) -> ShardInfo:
    import webdataset as wds  # here: it imports torch, and the manifest's readers (the CLI) import this module

    name = f"{split}-{shard_idx:06d}.tar"
    path = out_dir / name
    # mtime=0: deterministic bytes, and no extra header block per member.
    with wds.TarWriter(str(path), mtime=0) as sink:
        for s, lo in enumerate(range(0, len(chunk), sequences_per_sample)):
            sink.write({"__key__": f"{shard_idx:06d}-{s:06d}", TOKENS: chunk[lo : lo + sequences_per_sample]})
    digest, size = hashlib.sha256(), 0
    with open(path, "rb") as f:
        while block := f.read(1 << 20):
            digest.update(block)
            size += len(block)
    return ShardInfo(name=name, bytes=size, sha256=digest.hexdigest(), sequences=len(chunk), tokens=int(chunk.size))


def write_shards(
    rows: np.ndarray, out_dir: Path, split: str, sequences_per_sample: int, samples_per_shard: int
) -> list[ShardInfo]:
    out_dir.mkdir(parents=True, exist_ok=True)
    per_shard = sequences_per_sample * samples_per_shard
    return [
        _write_shard(rows[start : start + per_shard], out_dir, split, i, sequences_per_sample)
        for i, start in enumerate(range(0, len(rows), per_shard))
    ]


class ShardWriter:
    """Packs documents into rows and writes each shard as soon as it is full: memory holds
    at most one shard's tokens. The shards equal ``write_shards(pack(all documents))``."""

    def __init__(
        self,
        out_dir: Path,
        split: str,
        eod_id: int,
        seq_len: int,
        sequences_per_sample: int,
        samples_per_shard: int,
        dtype: np.dtype,
    ) -> None:
        out_dir.mkdir(parents=True, exist_ok=True)
        self.out_dir, self.split, self.dtype = out_dir, split, dtype
        self.row = seq_len + 1
        self.sequences_per_sample = sequences_per_sample
        self.per_shard = sequences_per_sample * samples_per_shard
        self._eod = np.asarray([eod_id], dtype=dtype)
        self._pending: list[np.ndarray] = []
        self._pending_tokens = 0
        self.shards: list[ShardInfo] = []
        self.documents = 0

    def add(self, ids: np.ndarray) -> None:
        self.documents += 1
        self._pending += [ids.astype(self.dtype, copy=False), self._eod]
        self._pending_tokens += len(ids) + 1
        if self._pending_tokens >= self.per_shard * self.row:
            stream = np.concatenate(self._pending)
            full = len(stream) // (self.per_shard * self.row)
            for i in range(full):
                chunk = stream[i * self.per_shard * self.row : (i + 1) * self.per_shard * self.row]
                self._emit(chunk.reshape(self.per_shard, self.row))
            rest = stream[full * self.per_shard * self.row :]
            self._pending, self._pending_tokens = [rest], len(rest)

    def _emit(self, rows: np.ndarray) -> None:
        self.shards.append(_write_shard(rows, self.out_dir, self.split, len(self.shards), self.sequences_per_sample))

    def close(self) -> list[ShardInfo]:
        """Write the last, partial shard; the tail shorter than a row is dropped."""
        stream = np.concatenate(self._pending) if self._pending else np.zeros(0, dtype=self.dtype)
        rows = len(stream) // self.row
        if rows:
            self._emit(stream[: rows * self.row].reshape(rows, self.row))
        self._pending, self._pending_tokens = [], 0
        return self.shards

    @property
    def sequences(self) -> int:
        return sum(s.sequences for s in self.shards)

    @property
    def tokens(self) -> int:
        return sum(s.tokens for s in self.shards)


@dataclass(frozen=True)
class StoredShard:
    """A committed shard to read: where it is and the sha256 its manifest records."""

    url: str
    sha256: str


def _read_bytes(url: str) -> bytes:
    """The whole object at ``url``: a local path or ``s3://bucket/key``."""
    if url.startswith("s3://"):
        bucket, _, key = url[len("s3://") :].partition("/")
        return _bucket_store(bucket).get_bytes(key)
    with open(url, "rb") as f:
        return f.read()


@functools.cache
def _bucket_store(bucket: str):
    # One client per process and bucket: creating a boto3 session costs ~0.1 s.
    return open_store(f"s3://{bucket}")


def check_digest(data: bytes, url: str, sha256: str) -> None:
    """Raise DataError unless ``data`` (the shard at ``url``) has the ``sha256`` its manifest records."""
    actual = hashlib.sha256(data).hexdigest()
    if actual != sha256:
        raise DataError(
            f"shard {url}: sha256 {actual}, the manifest records {sha256}: "
            "the dataset was modified after it was committed; prepare it again"
        )


def read_shard(shard: StoredShard | str) -> np.ndarray:
    """The packed rows of one shard, ``[rows, seq_len + 1]``.

    A ``StoredShard`` is read whole and its sha256 checked against the manifest's before a
    byte of it is parsed: a shard is small (about 0.5 MB by default; the loader holds decoded
    windows of them anyway), so holding it until it is checked costs one shard of memory,
    and no row of a modified shard is ever used. A bare path or URL is read unchecked: only
    for shards this process has just written (tests, tools), never for a committed dataset.
    """
    url = shard if isinstance(shard, str) else shard.url
    data = _read_bytes(url)
    if not isinstance(shard, str):
        check_digest(data, url, shard.sha256)
    return parse_shard(data, url)


def parse_shard(data: bytes, url: str) -> np.ndarray:
    """The rows of a shard's bytes. No generic decoders (WebDataset's ``.decode()`` unpickles
    ``.pyd``/``.pickle`` members and ``torch.load``s ``.pth`` ones): a shard holds what we
    wrote, one ``tokens.npy`` per sample, loaded without pickle."""
    arrays = [_tokens(key, members, url) for key, members in _samples(data, url)]
    if not arrays:
        raise DataError(f"shard {url} holds no samples: not written by this pipeline; prepare it again")
    return np.concatenate(arrays)


def _samples(data: bytes, url: str) -> Iterator[tuple[str, dict[str, bytes]]]:
    """WebDataset's grouping: consecutive members ``<key>.<ext>`` form the sample ``key``."""
    key, members = None, {}
    with tarfile.open(fileobj=io.BytesIO(data), mode="r:") as tar:  # uncompressed, as written
        for info in tar:
            folder, _, base = info.name.rpartition("/")
            stem, dot, ext = base.partition(".")
            if not info.isfile() or not dot:
                raise DataError(f"shard {url} holds {info.name!r}: not written by this pipeline; prepare it again")
            name = f"{folder}/{stem}" if folder else stem
            if name != key:
                if key is not None:
                    yield key, members
                key, members = name, {}
            members[ext] = tar.extractfile(info).read()
    if key is not None:
        yield key, members


def _tokens(key: str, members: dict[str, bytes], url: str) -> np.ndarray:
    if sorted(members) != [TOKENS]:
        raise DataError(
            f"shard {url}, sample {key} holds {sorted(members)}, not just {TOKENS}: "
            "not written by this pipeline; prepare it again"
        )
    rows = _npy(members[TOKENS])
    if rows.ndim != 2:
        raise DataError(f"shard {url}, sample {key}: {TOKENS} has shape {rows.shape}, not [rows, seq_len + 1]")
    return rows


_NPY_V1 = b"\x93NUMPY\x01"


@functools.lru_cache(maxsize=64)
def _npy_v1_header(header: bytes) -> tuple[np.dtype, tuple[int, ...]] | None:
    """dtype and shape of a version-1 ``.npy`` header; ``None`` for what ``np.load`` should judge."""
    stream = io.BytesIO(header)
    np.lib.format.read_magic(stream)
    shape, fortran_order, dtype = np.lib.format.read_array_header_1_0(stream)
    return None if fortran_order or dtype.hasobject else (dtype, shape)


def _npy(data: bytes) -> np.ndarray:
    """``np.load(data, allow_pickle=False)``, but a header already seen is not parsed again: every
    sample of a shard has the same one (bar the last), and parsing its Python literal was most of
    the loader's decode time. The array is a read-only view of ``data``; anything unusual (another
    format version, a short payload) goes to ``np.load`` as before."""
    if data[:7] == _NPY_V1 and len(data) >= 10:
        end = 10 + int.from_bytes(data[8:10], "little")
        parsed = _npy_v1_header(data[:end])
        if parsed is not None:
            dtype, shape = parsed
            count = int(np.prod(shape))
            if len(data) - end == count * dtype.itemsize:
                return np.frombuffer(data, dtype=dtype, count=count, offset=end).reshape(shape)
    return np.load(io.BytesIO(data), allow_pickle=False)


def read_rows(shards: Sequence[StoredShard | str]) -> np.ndarray:
    """All packed rows of ``shards`` as one ``[rows, seq_len + 1]`` array (see ``read_shard``)."""
    arrays = [read_shard(shard) for shard in shards]
    if not arrays:
        raise ValueError(f"no samples in shards {shards}")
    return np.concatenate(arrays)
