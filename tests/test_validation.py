"""The validation gate: a good dataset passes; each corruption fails, naming its expectation."""

import shutil

import pytest

from common.contracts import DOC_STATS, DatasetRef
from data_prep.config import ValidationConfig
from data_prep.prepare import prepare_dataset
from data_prep.validation import ValidationFailed, check_dataset
from storage import open_store
from tests.helpers import distinct_docs, tiny_data, tiny_tokenizer, write_corpus


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


def failure_of(store, ref, config=None) -> str:
    with pytest.raises(ValidationFailed) as failure:
        check_dataset(store, ref, config or ValidationConfig())
    message = str(failure.value)
    assert "training was not started" in message
    assert not store.get_json(f"{ref.prefix}/validation/result.json")["success"]
    assert store.is_committed(f"{ref.prefix}/validation")  # the report is kept, pass or fail
    return message


@pytest.mark.slow
def test_good_dataset_passes_and_everything_is_recorded(dataset):
    store, ref = dataset
    check_dataset(store, ref, ValidationConfig())
    result = store.get_json(f"{ref.prefix}/validation/result.json")
    assert result["success"] and {o["suite"] for o in result["outcomes"]} == {"documents", "shards", "dataset"}
    assert all(o["success"] for o in result["outcomes"]) and len(result["outcomes"]) >= 15
    suite = store.get_json(f"{ref.prefix}/validation/suite.json")
    fallback = next(e for e in suite["dataset"] if e["kwargs"].get("column") == "byte_fallback_ratio")
    assert fallback["type"] == "expect_column_max_to_be_between" and fallback["kwargs"]["max_value"] == 0.05
    report = store.get_bytes(f"{ref.prefix}/validation/report.html").decode()
    assert "PASSED" in report and "http" not in report  # self-contained: renders offline and in a Deck
    # Our report only: GE's Data Docs (CDN scripts and styles, data values unescaped) are not built.
    files = {key.removeprefix(f"{ref.prefix}/validation/") for key in store.list(f"{ref.prefix}/validation/")}
    assert files == {"result.json", "suite.json", "report.html", "_COMMITTED"}


def test_truncated_shard(dataset):
    store, ref = dataset
    shard = store.root / ref.prefix / "shards" / "train-000000.tar"
    shard.write_bytes(shard.read_bytes()[:1000])
    message = failure_of(store, ref)
    for name in ("shards.sha256_matches", "shards.stored_bytes", "shards.stored_sequences"):
        assert name in message
    report = store.get_bytes(f"{ref.prefix}/validation/report.html").decode()
    assert "FAILED" in report and "each shard: sha256 matches the manifest" in report  # the check in words


def test_shard_swapped_for_another(dataset):
    store, ref = dataset
    shards = store.root / ref.prefix / "shards"
    shutil.copyfile(shards / "train-000001.tar", shards / "train-000000.tar")  # same size, other content
    message = failure_of(store, ref)
    assert "shards.sha256_matches" in message and "shards.stored_bytes" not in message


def test_validation_document_leaked_into_train(dataset):
    store, ref = dataset
    path = store.root / ref.prefix / DOC_STATS
    lines = path.read_text().splitlines()
    val_line = next(line for line in lines if ",val," in line)
    path.write_text("\n".join(lines[:1] + [val_line.replace(",val,", ",train,")] + lines[1:]) + "\n")
    message = failure_of(store, ref)
    assert "dataset.train_val_overlap" in message and "documents.sha256" in message


def test_document_statistics_that_lost_rows(dataset):
    store, ref = dataset
    path = store.root / ref.prefix / DOC_STATS
    path.write_text("\n".join(path.read_text().splitlines()[:5]) + "\n")
    assert "documents: expect_table_row_count_to_equal" in failure_of(store, ref)


def test_all_empty_documents(dataset):
    store, ref = dataset
    path = store.root / ref.prefix / DOC_STATS
    header, *rows = path.read_text().splitlines()
    zeroed = [",".join(r.split(",")[:4] + ["0", "0"]) for r in rows]  # tokens and byte_fallback = 0
    path.write_text("\n".join([header, *zeroed]) + "\n")
    assert "documents.tokens: expect_column_values_to_be_between" in failure_of(store, ref)


def test_duplicate_flood(tmp_path):
    unique = {f"u{i}.txt": text for i, text in enumerate(distinct_docs(12))}
    flood = {f"copy{i}.txt": "The same boilerplate licence text, copied everywhere. " * 10 for i in range(30)}
    store = open_store(str(tmp_path / "store"))
    ref = prepare_dataset(tiny_data(sources=[str(write_corpus(tmp_path / "c", unique | flood))]), tiny_tokenizer(), store)
    message = failure_of(store, ref)
    assert "dataset.duplicate_fraction" in message and "observed 0.6904" in message


def test_mostly_skipped_corpus(tmp_path):
    docs = {f"d{i}.txt": text for i, text in enumerate(distinct_docs(8))}
    docs |= {f"empty{i}.txt": "" for i in range(20)}
    store = open_store(str(tmp_path / "store"))
    ref = prepare_dataset(tiny_data(sources=[str(write_corpus(tmp_path / "c", docs))]), tiny_tokenizer(), store)
    assert "dataset.skipped_fraction" in failure_of(store, ref)


def test_text_the_tokenizer_cannot_merge(tmp_path):
    # A 300-entry vocabulary has room for a few merges only: CJK text stays mostly raw bytes.
    docs = {f"ja{i}.txt": "日本語の文章と漢字、ひらがな、カタカナを混ぜた長い文書です。" * (3 + i) for i in range(8)}
    store = open_store(str(tmp_path / "store"))
    ref = prepare_dataset(tiny_data(sources=[str(write_corpus(tmp_path / "c", docs))]), tiny_tokenizer(vocab_size=300), store)
    assert "dataset.byte_fallback_ratio" in failure_of(store, ref)


def test_threshold_from_config(dataset):
    store, ref = dataset
    message = failure_of(store, ref, ValidationConfig(min_documents=100_000))
    assert "documents: expect_table_row_count_to_be_between failed (observed 60; expected min_value=100000" in message


@pytest.mark.slow
def test_a_quality_rule_that_drops_too_much_is_named_with_its_settings(tmp_path):
    docs = {f"d{i}.txt": text for i, text in enumerate(distinct_docs(12))}
    # Mostly one repeated line (repetition rule rep_dup_line_chars, on by default at 0.5).
    docs |= {f"spam{i}.txt": f"Offer {i} of the week.\n" + "Buy cheap watches at the shop today!\n" * 12 for i in range(10)}
    store = open_store(str(tmp_path / "store"))
    ref = prepare_dataset(tiny_data(sources=[str(write_corpus(tmp_path / "c", docs))]), tiny_tokenizer(), store)
    assert ref.stats["skipped_quality_rep_dup_line_chars"] == 10
    message = failure_of(store, ref)
    assert "dataset.skipped_quality_rep_dup_line_chars: expect_column_max_to_be_between failed (observed 0.4545" in message
    assert "loosen or switch off data.quality.repetition" in message and "validation.max_quality_fraction" in message
    assert "language_fraction" not in message and "pii_fraction" not in message  # checked, and passed
    check_dataset(store, ref, ValidationConfig(max_quality_fraction=0.5))
