"""Every shard's sha256 is checked against the committed manifest before its rows are used: a
shard modified after the commit (same size, a valid tar, other tokens) is refused by the
training loader, by load_split (evaluation) and by the validation gate, locally and on S3."""

from __future__ import annotations

import dataclasses
import hashlib
import io
import json
import pickle
import re
from pathlib import Path

import numpy as np
import pytest

from data_prep.config import ValidationConfig
from data_prep.errors import DataError
from data_prep.manifest import load_manifest, stored_shards
from data_prep.shards import StoredShard, read_rows, read_shard, write_shards
from data_prep.validation import ValidationFailed, check_dataset, report_html
from storage import open_store
from tests.helpers import fresh_copy
from training.data import StreamingLoader, load_split

SHARD = "shards/train-000000.tar"


class Payload:
    """Unpickling this calls Path.touch: proof that a pickle ran."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):
        return (Path.touch, (self.marker,))


@pytest.fixture
def dataset(tiny_dataset, store):
    """A private copy of the tiny dataset in ``store`` (a local folder, then the S3 server)."""
    store.upload_dir(Path(tiny_dataset.store) / tiny_dataset.prefix, tiny_dataset.prefix)  # with its commit marker
    return store, dataclasses.replace(tiny_dataset, store=store.uri)


def tampered(store, ref, name: str, tmp_path: Path) -> tuple[str, str]:
    """Replace shard ``name`` by a valid shard of the same size holding other tokens; returns
    the manifest's sha256 and the new one."""
    manifest = load_manifest(store, ref)
    entry = next(s for split in manifest["splits"].values() for s in split["shards"] if s["name"] == name)
    rows = read_shard(StoredShard(store.url(f"{ref.prefix}/{name}"), entry["sha256"]))
    rows[0] = (rows[0] + 1) % manifest["vocab_size"]
    split = Path(name).name.split("-")[0]
    data = manifest["config"]["data"]
    (info,) = write_shards(rows, tmp_path / "forged", split, data["sequences_per_sample"], data["samples_per_shard"])
    forged = (tmp_path / "forged" / info.name).read_bytes()
    assert len(forged) == entry["bytes"] and info.sha256 != entry["sha256"]  # same size, a valid tar, other bytes
    store.put_bytes(f"{ref.prefix}/{name}", forged)
    return entry["sha256"], info.sha256


def refusal(expected: str, actual: str) -> str:
    return (
        rf"{re.escape(SHARD)}: sha256 {actual}, the manifest records {expected}: "
        r"the dataset was modified after it was committed; prepare it again"
    )


@pytest.mark.slow
def test_a_tampered_shard_is_refused_by_the_loader_and_load_split(dataset, tmp_path):
    store, ref = dataset
    assert len(load_split(ref, "train")[0]) > 0  # the pristine copy reads
    expected, actual = tampered(store, ref, SHARD, tmp_path)
    with pytest.raises(DataError, match=refusal(expected, actual)):
        load_split(ref, "train")
    loader, _ = StreamingLoader.for_split(ref, "train", 8, 7, window_shards=len(manifest_shards(store, ref)))
    with loader, pytest.raises(DataError, match=refusal(expected, actual)):
        loader.batch(0)  # one window holds every shard: the first batch needs the tampered one


def manifest_shards(store, ref) -> list:
    return load_manifest(store, ref)["splits"]["train"]["shards"]


def test_a_tampered_validation_shard_is_refused_for_evaluation(dataset, tmp_path):
    store, ref = dataset
    name = "shards/val-000000.tar"
    expected, actual = tampered(store, ref, name, tmp_path)
    with pytest.raises(DataError, match=rf"{re.escape(name)}: sha256 {actual}, the manifest records {expected}"):
        load_split(ref, "val")  # what evaluation reads


def test_a_rewritten_manifest_does_not_vouch_for_a_tampered_shard(dataset, tmp_path):
    store, ref = dataset
    _, actual = tampered(store, ref, SHARD, tmp_path)
    manifest = load_manifest(store, ref)
    manifest["splits"]["train"]["shards"][0]["sha256"] = actual
    store.put_bytes(f"{ref.prefix}/manifest.json", json.dumps(manifest, indent=2, sort_keys=True).encode())
    with pytest.raises(DataError, match=rf"manifest\.json hashes to version \w+, not {ref.version}: the dataset was modified"):
        load_split(ref, "train")


@pytest.mark.slow
def test_a_tampered_shard_fails_validation_naming_it(tiny_dataset, tmp_path):
    ref = fresh_copy(tiny_dataset, tmp_path / "store")
    store = open_store(ref.store)
    expected, actual = tampered(store, ref, SHARD, tmp_path)
    with pytest.raises(ValidationFailed) as failure:
        check_dataset(store, ref, ValidationConfig())
    message = str(failure.value)
    assert "shards.sha256_matches" in message and re.search(refusal(expected, actual), message)
    validation = failure.value.validation  # what the task renders its Deck from
    assert sorted(o.column for o in validation.failures) == ["sha256_matches", "stored_sequences"]
    assert len(validation.modified) == 1 and actual in validation.modified[0]
    html = report_html(ref, validation.outcomes, validation.modified)
    assert "FAILED" in html and actual in html and SHARD in html


def test_a_pickle_planted_in_a_committed_shard_is_never_parsed(tiny_dataset, tmp_path):
    import tarfile

    marker = tmp_path / "payload-ran"
    manifest_shard = manifest_shards(open_store(tiny_dataset.store), tiny_dataset)[0]
    original = Path(tiny_dataset.store) / tiny_dataset.prefix / SHARD
    planted = tmp_path / "train-000000.tar"
    with tarfile.open(original) as src, tarfile.open(planted, "w") as dst:
        for info in src:
            dst.addfile(info, src.extractfile(info))
        evil = pickle.dumps(Payload(marker))
        info = tarfile.TarInfo("000000-000000.evil.pyd")
        info.size = len(evil)
        dst.addfile(info, io.BytesIO(evil))
    assert hashlib.sha256(planted.read_bytes()).hexdigest() != manifest_shard["sha256"]
    with pytest.raises(DataError, match="the dataset was modified after it was committed"):
        read_rows([StoredShard(str(planted), manifest_shard["sha256"])])
    assert not marker.exists()


def test_what_was_committed_reads_back_checked(tiny_dataset):
    store = open_store(tiny_dataset.store)
    manifest = load_manifest(store, tiny_dataset)
    shards = stored_shards(store, tiny_dataset, manifest, "val")
    assert [s.sha256 for s in shards] == [s["sha256"] for s in manifest["splits"]["val"]["shards"]]
    assert len(read_rows(shards)) == manifest["splits"]["val"]["sequences"]
    assert np.array_equal(read_rows(shards), read_rows([s.url for s in shards]))
