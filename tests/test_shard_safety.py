"""Shards decode only what the pipeline wrote: a planted pickle is refused, never run."""

from __future__ import annotations

import io
import pickle
import tarfile
from pathlib import Path

import numpy as np
import pytest

from data_prep.errors import DataError
from data_prep.shards import read_rows


class Payload:
    """Unpickling this calls Path.touch: proof that a pickle ran."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):
        return (Path.touch, (self.marker,))


def _tar(path: Path, members: dict[str, bytes]) -> Path:
    with tarfile.open(path, "w") as tar:
        for name, data in members.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return path


def _npy(array: np.ndarray) -> bytes:
    buffer = io.BytesIO()
    np.save(buffer, array, allow_pickle=False)
    return buffer.getvalue()


def test_a_planted_pickle_member_is_refused_and_never_run(tmp_path: Path) -> None:
    marker = tmp_path / "payload-ran"
    rows = np.arange(2 * 9, dtype=np.uint16).reshape(2, 9)
    members = {"000000.tokens.npy": _npy(rows), "000000.evil.pyd": pickle.dumps(Payload(marker))}
    shard = _tar(tmp_path / "train-000000.tar", members)
    with pytest.raises(DataError, match=r"evil\.pyd.*not written by this pipeline"):
        read_rows([str(shard)])
    assert not marker.exists()


def test_an_object_array_is_refused_and_never_run(tmp_path: Path) -> None:
    marker = tmp_path / "payload-ran"
    buffer = io.BytesIO()
    np.save(buffer, np.array([Payload(marker)], dtype=object), allow_pickle=True)
    shard = _tar(tmp_path / "train-000000.tar", {"000000.tokens.npy": buffer.getvalue()})
    with pytest.raises(ValueError, match="allow_pickle"):
        read_rows([str(shard)])
    assert not marker.exists()


def test_what_we_wrote_reads_back(tmp_path: Path) -> None:
    rows = np.arange(3 * 9, dtype=np.uint16).reshape(3, 9)
    shard = _tar(tmp_path / "train-000000.tar", {"000000.tokens.npy": _npy(rows)})
    assert np.array_equal(read_rows([str(shard)]), rows)
