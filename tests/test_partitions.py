"""The dataset does not depend on how the listing is cut: the same corpus and config give the same
version, and so the same shard bytes, at 1, 2 and 4 partitions, with duplicates, near duplicates,
reader skips and the ``max_documents`` cut falling across partition boundaries."""

import pytest

from data_prep.partitions import cut
from data_prep.prepare import list_corpus, load_manifest, prepare_dataset
from data_prep.sources import RawFile
from storage import open_store
from tests.helpers import KEPT_IN_MIXED, distinct_docs, mixed_corpus, tiny_data, tiny_tokenizer, write_corpus

PARTITIONS = (1, 2, 4)


def prepared(tmp_path, max_documents: int = 0):
    """The dataset of the mixed corpus at each partition count, each in a fresh store folder."""
    corpus, _ = mixed_corpus(tmp_path / "corpus")
    refs = {}
    for parts in PARTITIONS:
        target = open_store(str(tmp_path / f"store{parts}"))
        refs[parts] = (
            target,
            prepare_dataset(
                tiny_data(sources=[str(corpus)], max_documents=max_documents, partitions=parts), tiny_tokenizer(), target
            ),
        )
    return refs


def test_same_version_and_shards_at_1_2_and_4_partitions(tmp_path):
    refs = prepared(tmp_path)
    versions = {parts: ref.version for parts, (_, ref) in refs.items()}
    assert len(set(versions.values())) == 1, versions
    store, ref = refs[4]
    manifest = load_manifest(store, ref)
    # The duplicates of doc0 and doc1 (dup.txt, near.txt) lie in other partitions than their originals.
    assert ref.stats["skipped_duplicate"] == 1 and ref.stats["skipped_near_duplicate"] == 1
    assert manifest["sources"]["skipped_examples"]["duplicate"] == ["dup.txt"]
    assert manifest["sources"]["skipped_examples"]["near_duplicate"] == ["near.txt"]
    assert ref.stats["documents_kept"] == KEPT_IN_MIXED
    assert ref.stats["skipped_bad_jsonl_record"] == ref.stats["skipped_binary"] == 1
    assert "partitions" not in manifest["config"]["data"]  # how the work was cut is not content
    # Each store holds the dataset alone: the stages' work files are gone.
    for target, _ in refs.values():
        assert {key.split("/")[1] for key in target.list("datasets/")} == {ref.version}


def test_the_max_documents_cut_is_global(tmp_path):
    refs = prepared(tmp_path, max_documents=20)
    assert len({ref.version for _, ref in refs.values()}) == 1
    _, ref = refs[2]
    # The first 20 documents to pass the filters, in listing order, are distinct: all kept. The two
    # files before them are reader skips (blob.txt, broken.txt.gz), counted; nothing after the cut is.
    assert ref.stats["documents_kept"] == 20 and ref.stats["documents_read"] == 22


def test_on_s3_the_version_is_the_local_one(tmp_path, s3_store):
    corpus, _ = mixed_corpus(tmp_path / "corpus")
    data = tiny_data(sources=[str(corpus)], max_documents=0, partitions=3)
    on_s3 = prepare_dataset(data, tiny_tokenizer(), s3_store)
    local = prepare_dataset(
        tiny_data(sources=[str(corpus)], max_documents=0, partitions=1), tiny_tokenizer(), open_store(str(tmp_path / "s"))
    )
    assert on_s3.version == local.version
    assert not [key for key in s3_store.list("datasets/") if "/work-" in f"/{key}"]


def test_a_failed_preparation_leaves_no_work_files(tmp_path):
    corpus = write_corpus(tmp_path / "c", {"a.txt": "tiny", "b.txt": "also tiny"})
    store = open_store(str(tmp_path / "s"))
    with pytest.raises(Exception, match="no usable text"):
        prepare_dataset(tiny_data(sources=[str(corpus)], partitions=2), tiny_tokenizer(), store)
    assert store.list("") == []


def files(sizes: list[int]) -> list[RawFile]:
    return [RawFile(name=f"f{i}", size=s, open=lambda: None) for i, s in enumerate(sizes)]


def test_partitions_are_contiguous_balanced_and_never_empty():
    parts = cut(files([10, 10, 10, 10, 100, 10, 10, 10]), 4)
    assert [(p.first_file, p.end_file) for p in parts] == [(0, 4), (4, 5), (5, 6), (6, 8)]
    assert all(p.of == 4 for p in parts)
    assert len(cut(files([1, 1]), 8)) == 2  # never more partitions than files
    # 0: one per 256 MB listed.
    assert len(cut(files([200 << 20] * 5), 0)) == 4 and len(cut(files([1]), 0)) == 1


def test_the_listing_is_cut_as_configured(tmp_path):
    corpus = write_corpus(tmp_path / "c", {f"d{i}.txt": t for i, t in enumerate(distinct_docs(10))})
    listing = list_corpus(tiny_data(sources=[str(corpus)], partitions=3))
    spans = [(p.first_file, p.end_file) for p in listing.partitions]
    assert len(spans) == 3 and spans[0][0] == 0 and spans[-1][1] == 10
    assert all(a[1] == b[0] for a, b in zip(spans, spans[1:], strict=False)) and all(lo < hi for lo, hi in spans)
