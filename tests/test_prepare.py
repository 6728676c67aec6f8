"""The prepare step end to end: counts, committed readable shards, determinism, errors."""

import numpy as np
import pytest

from data_prep import prepare as stages
from data_prep.config import DataConfig
from data_prep.errors import DataError
from data_prep.manifest import load_manifest, shard_urls
from data_prep.prepare import prepare_dataset
from data_prep.shards import ShardWriter, pack, read_rows, write_shards
from data_prep.workers import split_of
from storage import open_store
from tests.helpers import KEPT_IN_MIXED, distinct_docs, mixed_corpus, tiny_data, tiny_tokenizer, write_corpus


def test_documents_are_cleaned_deduplicated_and_skips_counted(tmp_path):
    root, expected = mixed_corpus(tmp_path / "corpus")
    ref = prepare_dataset(tiny_data(sources=[str(root)], max_documents=0), tiny_tokenizer(), open_store(str(tmp_path / "s")))
    skipped = {k.removeprefix("skipped_"): v for k, v in ref.stats.items() if k.startswith("skipped_") and k != "skipped_total"}
    assert skipped == expected
    assert ref.stats["documents_kept"] == KEPT_IN_MIXED
    assert ref.stats["documents_read"] == KEPT_IN_MIXED + sum(expected.values())
    assert ref.stats["duplicates_total"] == 2
    assert ref.stats["train_documents"] + ref.stats["val_documents"] == KEPT_IN_MIXED
    assert ref.stats["val_documents"] >= 1


def test_split_is_a_function_of_content():
    assert split_of("00000000" + "0" * 56, 0.1) == "val"
    assert split_of("ffffffff" + "0" * 56, 0.1) == "train"


def test_prepare_writes_committed_readable_dataset(store, tmp_path):
    root, _ = mixed_corpus(tmp_path / "corpus")
    ref = prepare_dataset(tiny_data(sources=[str(root)], max_documents=0), tiny_tokenizer(), store)
    assert store.is_committed(ref.prefix)
    manifest = load_manifest(store, ref)
    for split in ("train", "val"):
        rows = read_rows(shard_urls(store, ref, manifest, split))
        assert rows.shape == (manifest["splits"][split]["sequences"], manifest["seq_len"] + 1)
        assert rows.dtype == np.uint16 and rows.max() < manifest["vocab_size"]
    assert (rows == manifest["eod_id"]).any()
    assert manifest["stats"] == ref.stats and manifest["summary"]["duplicate_rate"] > 0
    assert manifest["sources"]["files"] == 40 and len(manifest["sources"]["listing_sha256"]) == 64
    assert manifest["sources"]["skipped_examples"]["binary"][0].endswith("blob.txt")
    assert store.exists(f"{ref.prefix}/tokenizer.json")


def test_same_input_same_bytes_and_version_whatever_the_worker_count(tmp_path):
    root, _ = mixed_corpus(tmp_path / "corpus")
    configs = {n: tiny_data(sources=[str(root)], max_documents=0, workers=w) for n, w in (("a", 1), ("b", 2))}
    refs = [prepare_dataset(config, tiny_tokenizer(), open_store(str(tmp_path / n))) for n, config in configs.items()]
    assert refs[0].version == refs[1].version
    files = [sorted((tmp_path / n / ref.prefix).rglob("*")) for n, ref in zip("ab", refs, strict=True)]
    assert [p.name for p in files[0]] == [p.name for p in files[1]]
    for a, b in zip(*files, strict=True):
        assert a.is_dir() or a.read_bytes() == b.read_bytes(), a.name


def test_the_same_corpus_elsewhere_is_the_same_dataset_and_the_same_training_order(tmp_path):
    """Where the corpus and the store live is not an input. The loader's order is seeded by the
    dataset version, so a version that named the paths gave another first batch, and another first
    loss, to the same corpus in another folder (the continued-pretraining test's bound failed in
    one fresh pytest folder of two)."""
    from training.data import StreamingLoader

    made = []
    for place in ("here", "somewhere/else"):
        root, _ = mixed_corpus(tmp_path / place / "corpus")  # names in folders, JSONL records, skips
        store = open_store(str(tmp_path / place / "store"))
        data = tiny_data(sources=[str(root)], max_documents=0)
        trained = prepare_dataset(data, tiny_tokenizer(), store)
        # Continued pretraining: a tokenizer reused from this store by its key.
        reused = prepare_dataset(data, tiny_tokenizer(), store, tokenizer_key=f"{trained.prefix}/tokenizer.json")
        made.append((store, trained, reused))
    (here, *here_refs), (there, *there_refs) = made
    for a, b in zip(here_refs, there_refs, strict=True):
        assert a.version == b.version
        keys = here.list(a.prefix)
        assert keys == there.list(b.prefix) and len(keys) > 4
        for key in keys:
            content = here.get_bytes(key)
            assert content == there.get_bytes(key), key
            assert str(tmp_path).encode() not in content, f"{key} names where the files were"
        loaders = [StreamingLoader.for_split(ref, "train", 8, seed=0)[0] for ref in (a, b)]
        with loaders[0] as one, loaders[1] as other:
            assert all(np.array_equal(one.batch(step).tokens, other.batch(step).tokens) for step in range(3))


def test_shards_written_while_streaming_equal_packing_everything(tmp_path):
    rng = np.random.default_rng(0)
    docs = [rng.integers(0, 300, size=rng.integers(1, 90)).astype(np.int32) for _ in range(200)]
    writer = ShardWriter(tmp_path / "stream", "train", 7, 15, 4, 3, np.dtype(np.uint16))
    for ids in docs:
        writer.add(ids)
    streamed = writer.close()
    whole = write_shards(pack(docs, 7, 15, np.dtype(np.uint16)), tmp_path / "whole", "train", 4, 3)
    assert streamed == whole and len(streamed) > 3


def test_the_sources_are_read_and_filtered_once_and_the_scan_text_is_what_is_encoded(tmp_path, monkeypatch):
    """The scan keeps the filtered text: training the tokenizer and encoding read it, not the sources."""
    import csv
    import json

    from data_prep import workers
    from data_prep.filters import filtered_text

    docs = distinct_docs(12)
    lines = [json.dumps({"text": docs[0] + " write to ann@example.com"}), "", json.dumps({"text": docs[1]})]
    lines += [json.dumps({"text": text}) for text in docs[2:6]] + [json.dumps({"text": docs[1]})]  # line 8: a duplicate
    root = write_corpus(tmp_path / "c", {"a.jsonl": "\n".join(lines), **{f"d{i}.txt": docs[i] for i in range(6, 12)}})
    calls = []
    monkeypatch.setattr(workers, "filtered_text", lambda raw, data: calls.append(raw) or filtered_text(raw, data))
    store = open_store(str(tmp_path / "s"))
    ref = prepare_dataset(tiny_data(sources=[str(root)], max_documents=0, workers=1), tiny_tokenizer(), store)
    assert len(calls) == ref.stats["documents_read"] == 13  # once each: not again to train or to encode
    assert ref.stats["documents_kept"] == 12 and ref.stats["skipped_duplicate"] == 1 and ref.stats["pii_email"] == 1
    rows = list(csv.reader(store.get_bytes(f"{ref.prefix}/doc_stats.csv").decode().splitlines()))[1:]
    names = [f"a.jsonl:{n}" for n in (1, 3, 4, 5, 6, 7)] + [f"d{i}.txt" for i in range(6, 12)]  # line 2 is blank
    assert sorted(row[0] for row in rows) == sorted(names)
    assert manifest_examples(store, ref)["duplicate"] == ["a.jsonl:8"]


def manifest_examples(store, ref) -> dict[str, list[str]]:
    return load_manifest(store, ref)["sources"]["skipped_examples"]


def test_max_documents_stops_early(tmp_path):
    root = write_corpus(tmp_path / "c", {f"d{i}.txt": text for i, text in enumerate(distinct_docs(40))})
    ref = prepare_dataset(tiny_data(sources=[str(root)], max_documents=25), tiny_tokenizer(), open_store(str(tmp_path / "s")))
    assert ref.stats["documents_kept"] == 25


def test_given_tokenizer_is_reused(tmp_path):
    root, _ = mixed_corpus(tmp_path / "corpus")
    store = open_store(str(tmp_path / "s"))
    first = prepare_dataset(tiny_data(sources=[str(root)], max_documents=0), tiny_tokenizer(), store)
    key = f"{first.prefix}/tokenizer.json"
    again = prepare_dataset(
        tiny_data(sources=[str(root)], max_documents=0), tiny_tokenizer(vocab_size=300), store, tokenizer_key=key
    )
    manifest = load_manifest(store, again)
    assert manifest["tokenizer"]["sha256"] == load_manifest(store, first)["tokenizer"]["sha256"]
    assert manifest["config"]["tokenizer_from"] == key and again.stats["tokenizer_sample_bytes"] == 0


def test_missing_source_is_a_clear_error(tmp_path):
    with pytest.raises(DataError, match="does not exist"):
        prepare_dataset(tiny_data(sources=[str(tmp_path / "nope")]), tiny_tokenizer(), open_store(str(tmp_path / "s")))


@pytest.mark.parametrize(
    "overrides, message",
    [
        ({"normalization": "NFX"}, "data.normalization is 'NFX'"),
        ({"seq_len": 0}, "data.seq_len is 0"),
        ({"min_chars": 10, "max_chars": 5}, "data.min_chars"),
        ({"val_fraction": 1.0}, "data.val_fraction"),
    ],
)
def test_bad_setting_is_a_clear_error(tmp_path, overrides, message):
    store = open_store(str(tmp_path / "s"))
    with pytest.raises(DataError, match=message):
        prepare_dataset(DataConfig(**overrides), tiny_tokenizer(), store)
    with pytest.raises(DataError, match="tokenizer.vocab_size"):
        prepare_dataset(DataConfig(), tiny_tokenizer(vocab_size=100), store)


def test_corpus_without_usable_text_fails_and_writes_nothing(tmp_path):
    root = write_corpus(tmp_path / "junk", {"a.txt": "", "b.txt": b"\x00\x00", "c.txt": "hi"})
    store = open_store(str(tmp_path / "store"))
    with pytest.raises(DataError, match="no usable text.*binary=1, empty=1, too_short=1"):
        prepare_dataset(tiny_data(sources=[str(root)]), tiny_tokenizer(), store)
    assert store.list("datasets") == []


def test_an_unreadable_corpus_fails_with_its_reasons_and_the_stages_leave_nothing(tmp_path):
    """Issue 33: a corpus whose every file fails to read (corrupt gzip) was told to lower data.min_chars, and the
    pipeline's stages (one task each, no prepare_dataset around them to clean up) left datasets/work-…/ behind."""
    root = tmp_path / "corrupt"
    root.mkdir()
    for i in range(3):  # gzip's magic bytes, then nothing a decoder accepts
        (root / f"part{i}.txt.gz").write_bytes(b"\x1f\x8b\x08\x00" + bytes(range(200)))
    store = open_store(str(tmp_path / "store"))
    prep = stages.plan(store, tiny_data(sources=[str(root)], partitions=1), tiny_tokenizer())
    stages.scan_stage(prep, store, 0)
    stages.exact_stage(prep, store, 0)
    stages.near_stage(prep, store, 0)
    assert store.list("datasets/")  # the scan's work files, until the stage that fails
    with pytest.raises(DataError) as failed:
        stages.resolve_stage(prep, store)
    message = str(failed.value)
    assert "has no readable document: every input failed to read (skipped: bad_gzip=3)" in message, message
    assert "min_chars" not in message  # no filter dropped anything: nothing to loosen
    assert store.list("") == []


def test_tokenizer_file_is_used_instead_of_training(tmp_path):
    root, _ = mixed_corpus(tmp_path / "corpus")
    store = open_store(str(tmp_path / "s"))
    first = prepare_dataset(tiny_data(sources=[str(root)], max_documents=0), tiny_tokenizer(), store)
    path = tmp_path / "tok" / "tokenizer.json"
    store.download(f"{first.prefix}/tokenizer.json", path)
    again = prepare_dataset(tiny_data(sources=[str(root)], max_documents=0), tiny_tokenizer(file=str(path)), store)
    assert load_manifest(store, again)["config"]["tokenizer_from"] == "tokenizer.file"
    assert again.stats["tokenizer_sample_bytes"] == 0 and again.stats["train_tokens"] == first.stats["train_tokens"]
    with pytest.raises(DataError, match="tokenizer.file"):
        prepare_dataset(tiny_data(sources=[str(root)]), tiny_tokenizer(file=str(tmp_path / "none.json")), store)
