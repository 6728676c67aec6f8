import gzip
import json

import numpy as np
import pytest

from data_prep.prepare import collect_documents, load_manifest, prepare_dataset, shard_urls, split_of
from data_prep.shards import read_rows
from data_prep.sources import DataError
from storage import open_store
from tests.conftest import tiny_data, tiny_tokenizer, write_corpus

PROSE = "The quick brown fox jumps over the lazy dog while the pipeline counts every token. "


def corpus(tmp_path):
    docs = {f"doc{i}.txt": f"Document {i}. " + PROSE * (3 + i % 5) for i in range(30)}
    docs["dup.txt"] = docs["doc0.txt"]  # exact duplicate
    docs["empty.txt"] = "   \n"
    docs["short.txt"] = "tiny"
    docs["latin1.txt"] = "caf\xe9 ".encode("latin-1") * 40
    docs["blob.txt"] = b"\x00\x01binary" * 50
    docs["nested/records.jsonl"] = "\n".join(
        [json.dumps({"text": f"Record {i}. " + PROSE * 2}) for i in range(5)] + ["{not json", json.dumps({"other": 1})]
    )
    docs["packed.txt.gz"] = gzip.compress(("Compressed. " + PROSE * 4).encode())
    docs["broken.txt.gz"] = gzip.compress(b"x" * 1000)[:20]
    return write_corpus(tmp_path / "corpus", docs)


def test_documents_are_cleaned_deduplicated_and_skips_counted(tmp_path):
    root = corpus(tmp_path)
    kept, skipped, read = collect_documents(tiny_data(sources=[str(root)], max_documents=0))
    sources = {doc.source for doc, _, _ in kept}
    assert len(kept) == 30 + 5 + 1  # txt docs, jsonl records, gz document
    assert any(s.endswith("records.jsonl:1") for s in sources)
    assert dict(skipped) == {
        "duplicate": 1,
        "empty": 1,
        "too_short": 1,
        "not_utf8": 1,
        "binary": 1,
        "bad_jsonl_record": 1,
        "jsonl_missing_text_field": 1,
        "bad_gzip": 1,
    }
    assert {split for _, _, split in kept} == {"train", "val"}


def test_split_is_a_function_of_content():
    assert split_of("00000000" + "0" * 56, 0.1) == "val"
    assert split_of("ffffffff" + "0" * 56, 0.1) == "train"


def test_prepare_writes_committed_readable_dataset(store, tmp_path):
    ref = prepare_dataset(tiny_data(sources=[str(corpus(tmp_path))], max_documents=0), tiny_tokenizer(), store)
    assert store.is_committed(ref.prefix)
    manifest = load_manifest(store, ref)
    for split in ("train", "val"):
        rows = read_rows(shard_urls(store, ref, manifest, split))
        assert rows.shape == (manifest["splits"][split]["sequences"], manifest["seq_len"] + 1)
        assert rows.dtype == np.uint16 and rows.max() < manifest["vocab_size"]
    assert (rows == manifest["eod_id"]).any()
    assert ref.stats["skipped_duplicate"] == 1 and ref.stats["documents_kept"] == 36


def test_same_input_same_version(tmp_path):
    config = tiny_data(sources=[str(corpus(tmp_path))], max_documents=0)
    first = prepare_dataset(config, tiny_tokenizer(), open_store(str(tmp_path / "a")))
    second = prepare_dataset(config, tiny_tokenizer(), open_store(str(tmp_path / "b")))
    assert first.version == second.version
    assert (tmp_path / "a" / first.prefix / "shards" / "train-000000.tar").read_bytes() == (
        tmp_path / "b" / second.prefix / "shards" / "train-000000.tar"
    ).read_bytes()


def test_s3_prefix_as_source(s3_store, tmp_path):
    s3_store.upload_dir(corpus(tmp_path), "raw")
    kept, _, _ = collect_documents(tiny_data(sources=[s3_store.url("raw")], max_documents=0))
    assert len(kept) == 36 and all(doc.source.startswith("s3://") for doc, _, _ in kept)


def test_missing_source_is_a_clear_error(tmp_path):
    with pytest.raises(DataError, match="does not exist"):
        collect_documents(tiny_data(sources=[str(tmp_path / "nope")]))


def test_corpus_without_usable_text_fails_and_writes_nothing(tmp_path):
    root = write_corpus(tmp_path / "junk", {"a.txt": "", "b.txt": b"\x00\x00", "c.txt": "hi"})
    store = open_store(str(tmp_path / "store"))
    with pytest.raises(DataError, match="no usable text.*empty=1"):
        prepare_dataset(tiny_data(sources=[str(root)]), tiny_tokenizer(), store)
    assert store.list("datasets") == []
