"""The dataset does not depend on how the listing is cut: the same corpus and config give the same
version, and so the same shard bytes, at 1, 2 and 4 partitions, with duplicates, near duplicates,
reader skips and the ``max_documents`` cut falling across partition boundaries."""

import gzip

import numpy as np
import pytest

from data_prep.manifest import load_manifest
from data_prep.partitions import cut
from data_prep.prepare import list_corpus, prepare_dataset
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


def partition_of(listing, name: str) -> int:
    """The index of the partition that holds the listed file ``name`` (its name inside the source)."""
    at = [f.relative for f in listing.files].index(name)
    return next(p.index for p in listing.partitions if p.first_file <= at < p.end_file)


@pytest.mark.slow
def test_same_version_and_shards_at_1_2_and_4_partitions(tmp_path):
    refs = prepared(tmp_path)
    versions = {parts: ref.version for parts, (_, ref) in refs.items()}
    assert len(set(versions.values())) == 1, versions
    store, ref = refs[4]
    manifest = load_manifest(store, ref)
    # The skipped duplicate of doc0 and near-duplicate of doc1 lie in other partitions than their originals
    # (as the plan cuts the listing): which copy is kept is decided across partitions, not within one.
    skipped = manifest["sources"]["skipped_examples"]
    pairs = {"duplicate": ("doc0.txt", *skipped["duplicate"]), "near_duplicate": ("doc1.txt", *skipped["near_duplicate"])}
    for parts in (2, 4):
        listing = list_corpus(tiny_data(sources=[str(tmp_path / "corpus")], partitions=parts), quiet=True)
        assert len(listing.partitions) == parts
        for kind, (original, copy) in pairs.items():
            where = {name: partition_of(listing, name) for name in (original, copy)}
            assert where[original] != where[copy], f"at {parts} partitions the {kind} shares its original's partition: {where}"
    assert ref.stats["skipped_duplicate"] == 1 and ref.stats["skipped_near_duplicate"] == 1
    assert manifest["sources"]["skipped_examples"]["duplicate"] == ["dup.txt"]
    assert manifest["sources"]["skipped_examples"]["near_duplicate"] == ["near.txt"]
    assert ref.stats["documents_kept"] == KEPT_IN_MIXED
    assert ref.stats["skipped_bad_jsonl_record"] == ref.stats["skipped_binary"] == 1
    assert "partitions" not in manifest["config"]["data"]  # how the work was cut is not content
    # Each store holds the dataset alone: the stages' work files are gone.
    for target, _ in refs.values():
        assert {key.split("/")[1] for key in target.list("datasets/")} == {ref.version}


@pytest.mark.slow
def test_the_max_documents_cut_is_global(tmp_path):
    refs = prepared(tmp_path, max_documents=20)
    assert len({ref.version for _, ref in refs.values()}) == 1
    _, ref = refs[2]
    # The first 20 documents to pass the filters, in listing order, are distinct: all kept. The two
    # files before them are reader skips (blob.txt, broken.txt.gz), counted; nothing after the cut is.
    assert ref.stats["documents_kept"] == 20 and ref.stats["documents_read"] == 22


@pytest.mark.slow
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


@pytest.mark.slow
def test_the_flyte_fan_out_makes_the_same_dataset(tmp_path, monkeypatch):
    """prepare_data, a dynamic workflow of map tasks, run by flytekit's local executor at 3
    partitions, commits the dataset prepare_dataset makes in one process at 1."""
    from tasks.data import prepare_data

    monkeypatch.setenv("FLYTE_LOCAL_CACHE_ENABLED", "false")  # run it, never a cached answer
    corpus, _ = mixed_corpus(tmp_path / "corpus")
    store = open_store(str(tmp_path / "flyte"))
    data = tiny_data(sources=[str(corpus)], max_documents=0, partitions=3)
    ref = prepare_data(store=store.uri, data=data, tokenizer=tiny_tokenizer(), base_model="", tokenizer_key="")
    local = prepare_dataset(
        tiny_data(sources=[str(corpus)], max_documents=0), tiny_tokenizer(), open_store(str(tmp_path / "one"))
    )
    assert ref.version == local.version
    assert {key.split("/")[1] for key in store.list("datasets/")} == {ref.version}


def test_a_partition_with_nothing_readable_is_counted_not_fatal(tmp_path):
    rng = np.random.default_rng(0)
    broken = gzip.compress(rng.bytes(6000))[:3000]  # cut short: not a whole gzip stream
    docs = {"a_broken.txt.gz": broken, "b_broken.txt.gz": broken}
    docs |= {f"c{i}.txt": text for i, text in enumerate(distinct_docs(8))}
    corpus = write_corpus(tmp_path / "corpus", docs)
    data = tiny_data(sources=[str(corpus)], max_documents=0, partitions=2)
    assert list_corpus(data).partitions[0].end_file <= 2  # the first partition holds broken files only
    ref = prepare_dataset(data, tiny_tokenizer(), open_store(str(tmp_path / "s")))
    assert ref.stats["skipped_bad_gzip"] == 2 and ref.stats["documents_kept"] == 8


@pytest.mark.slow
def test_a_stage_that_failed_runs_again_alone(tmp_path, monkeypatch):
    """What Flyte's retry of one map task does: the failed partition's stage runs again, alone, and
    the dataset is the one an undisturbed run makes (a stage's outputs are whole objects, rewritten)."""
    from data_prep import encode, prepare

    corpus, _ = mixed_corpus(tmp_path / "corpus")
    data = tiny_data(sources=[str(corpus)], max_documents=0, partitions=3)
    store = open_store(str(tmp_path / "s"))
    prep = prepare.plan(store, data, tiny_tokenizer())
    for index in range(3):
        prepare.scan_stage(prep, store, index)
    for shard in range(3):
        prepare.exact_stage(prep, store, shard)
    for shard in range(3):
        prepare.near_stage(prep, store, shard)
    prepare.resolve_stage(prep, store)
    prepare.tokenizer_stage(prep, store)
    real = encode.encode_partition
    failing = {"left": 1}

    def flaky(files, part, *rest):
        if part.index == 1 and failing["left"]:
            failing["left"] -= 1
            real(files, part, *rest)  # wrote its outputs, then the pod was lost
            raise ConnectionError("pod lost")
        return real(files, part, *rest)

    monkeypatch.setattr(prepare, "encode_partition", flaky)
    prepare.encode_stage(prep, store, 0)
    with pytest.raises(ConnectionError):
        prepare.encode_stage(prep, store, 1)
    prepare.encode_stage(prep, store, 1)  # the retry: this partition alone
    prepare.encode_stage(prep, store, 2)
    ref = prepare.commit_stage(prep, store, [prepare.pack_stage(prep, store, job) for job in prepare.pack_jobs(prep, store)])
    undisturbed = prepare_dataset(data, tiny_tokenizer(), open_store(str(tmp_path / "other")))
    assert ref.version == undisturbed.version
    assert not [key for key in store.list("datasets/") if "/work-" in f"/{key}" or key.startswith("datasets/work-")]
