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
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO

import numpy as np
import webdataset as wds
from webdataset.gopen import gopen_schemes

from data_prep.sources import DataError
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


def _gopen_s3(url: str, mode: str = "rb", bufsize: int = 8192, **_kw) -> IO[bytes]:
    if mode != "rb":
        raise ValueError("s3:// shards are written through the store, not gopen")
    bucket, _, key = url[len("s3://") :].partition("/")
    return _bucket_store(bucket).open_read(key)


@functools.cache
def _bucket_store(bucket: str):
    # One client per process and bucket: creating a boto3 session costs ~0.1 s.
    return open_store(f"s3://{bucket}")


def register_s3_scheme() -> None:
    """Let WebDataset open ``s3://`` URLs: it has no scheme of its own, so stream objects through boto3."""
    gopen_schemes.setdefault("s3", _gopen_s3)


def _every_node(src):
    # Each rank reads every shard: the global order is decided after loading.
    yield from src


def iter_shard_arrays(urls: list[str]) -> Iterator[np.ndarray]:
    """The token arrays of the shards at ``urls`` (local paths or s3:// URLs), in order."""
    register_s3_scheme()
    # No .decode(): its default decoders unpickle .pyd/.pickle members and torch.load .pth ones.
    # A shard holds what we wrote, one tokens.npy per sample, loaded without pickle.
    dataset = wds.WebDataset(urls, shardshuffle=False, nodesplitter=_every_node, workersplitter=None)
    for sample in dataset:
        yield _tokens(sample)


def _tokens(sample: dict) -> np.ndarray:
    members = sorted(k for k in sample if not k.startswith("__"))
    if members != [TOKENS]:
        where = f"{sample.get('__url__', '?')}, sample {sample.get('__key__', '?')}"
        raise DataError(f"shard {where} holds {members}, not just {TOKENS}: not written by this pipeline; prepare it again")
    return np.load(io.BytesIO(sample[TOKENS]), allow_pickle=False)


def read_rows(urls: list[str]) -> np.ndarray:
    """All packed rows of the shards at ``urls`` as one ``[rows, seq_len + 1]`` array."""
    arrays = list(iter_shard_arrays(urls))
    if not arrays:
        raise ValueError(f"no samples in shards {urls}")
    return np.concatenate(arrays)
