import shutil

import pytest

from data_prep.prepare import DOC_STATS, DatasetRef, prepare_dataset
from data_prep.validation import ValidationConfig, ValidationFailed, check_dataset
from storage import open_store
from tests.conftest import tiny_data, tiny_tokenizer


@pytest.fixture(scope="module")
def pristine(tmp_path_factory):
    root = tmp_path_factory.mktemp("pristine")
    return root, prepare_dataset(tiny_data(), tiny_tokenizer(), open_store(str(root)))


@pytest.fixture
def dataset(pristine, tmp_path):
    """A private copy of the pristine dataset that a test may corrupt."""
    root, ref = pristine
    shutil.copytree(root, tmp_path / "store")
    store = open_store(str(tmp_path / "store"))
    return store, DatasetRef(store=store.uri, version=ref.version, prefix=ref.prefix, stats=ref.stats)


def test_good_dataset_passes_and_report_is_stored(dataset):
    store, ref = dataset
    check_dataset(store, ref, ValidationConfig())
    result = store.get_json(f"{ref.prefix}/validation/result.json")
    assert result["success"] and set(result["suites"]) == {"documents", "shards", "dataset"}
    assert b"<html" in store.get_bytes(f"{ref.prefix}/validation/report.html").lower()
    assert store.is_committed(f"{ref.prefix}/validation")


def test_truncated_shard_fails_naming_checksum_and_size(dataset):
    store, ref = dataset
    shard = store.root / ref.prefix / "shards" / "train-000000.tar"
    shard.write_bytes(shard.read_bytes()[:1000])
    with pytest.raises(ValidationFailed) as failure:
        check_dataset(store, ref, ValidationConfig())
    message = str(failure.value)
    assert "shards.sha256_matches" in message and "shards.stored_bytes" in message
    assert "training was not started" in message
    assert not store.get_json(f"{ref.prefix}/validation/result.json")["success"]


def test_validation_document_leaked_into_train_fails(dataset):
    store, ref = dataset
    path = store.root / ref.prefix / DOC_STATS
    lines = path.read_text().splitlines()
    val_line = next(line for line in lines if ",val," in line)
    path.write_text("\n".join(lines + [val_line.replace(",val,", ",train,")]) + "\n")
    with pytest.raises(ValidationFailed, match="train_val_overlap"):
        check_dataset(store, ref, ValidationConfig())


def test_threshold_from_config(dataset):
    store, ref = dataset
    with pytest.raises(ValidationFailed, match=r"documents: expect_table_row_count_to_be_between.*min_value=100000"):
        check_dataset(store, ref, ValidationConfig(min_documents=100_000))
