"""Exact and near-duplicate detection: the hash set, MinHash estimates, LSH verdicts."""

import hashlib

import numpy as np

from data_prep.dedup import OWNERS_PER_KEY, BandOwners, Deduplicator, HashSet64, digest_key, near_row, shingle_hashes, signature
from tests.helpers import distinct_docs


def test_hash_set_grows_and_answers_for_whole_arrays():
    rng = np.random.default_rng(0)
    keys = np.unique(rng.integers(1, 2**63, size=50_000, dtype=np.uint64))
    table = HashSet64(capacity=16)
    for chunk in np.array_split(keys, 7):
        table.add_new(chunk)
    assert len(table) == len(keys) and table.contains(keys).all()
    others = rng.integers(1, 2**63, size=10_000, dtype=np.uint64)
    assert not table.contains(np.setdiff1d(others, keys)).any()
    assert table.nbytes <= 4 * 8 * len(keys)  # at most half full, doubling


def test_band_owners_hold_several_owners_a_key_through_growth():
    rng = np.random.default_rng(1)
    keys = np.unique(rng.integers(1, 2**63, size=5_000, dtype=np.uint64))
    table = BandOwners(capacity=16)
    for owner in range(3):  # three owners each, added in chunks that make the table grow
        for chunk in np.array_split(np.arange(len(keys)), 5):
            table.add(keys[chunk], np.full(len(chunk), owner))
    at, owners = table.owners(keys)
    assert len(table) == 3 * len(keys) and table.nbytes <= 4 * 8 * len(table)
    assert (np.bincount(at, minlength=len(keys)) == 3).all()
    assert (owners.reshape(-1, 3) == [0, 1, 2]).all()  # grouped by key, in the order added
    assert len(table.owners(rng.integers(1, 2**63, size=1000, dtype=np.uint64))[0]) == 0


def test_a_large_family_of_alike_documents_bounds_the_owners_a_key_holds():
    base = distinct_docs(1, words_per_doc=300)[0]
    family = [f"{base} variant {i}" for i in range(3 * OWNERS_PER_KEY)]
    assert verdicts(family) == [""] + ["near_duplicate"] * (len(family) - 1)
    dedup = Deduplicator(near=True, threshold=1.5)  # no estimate reaches it: every one is kept
    rows = np.array([near_row(t, 5, 16, 8) for t in family])
    assert dedup.judge(np.arange(1, len(family) + 1, dtype=np.uint64), rows) == [""] * len(family)
    assert dedup.rejected_candidates == len(family) - 1
    # Each of the first document's band keys holds at most OWNERS_PER_KEY owners, not the whole family.
    at, _ = dedup._owners.owners(rows[0, :16])
    assert np.bincount(at, minlength=16).max() == OWNERS_PER_KEY


def jaccard_estimate(a: str, b: str, length: int = 256) -> float:
    return float((signature(shingle_hashes(a, 5), length) == signature(shingle_hashes(b, 5), length)).mean())


def test_signature_agreement_tracks_shingle_similarity():
    base = distinct_docs(1, words_per_doc=400)[0].split(" ")
    edited = list(base)
    for i in range(0, len(edited), 40):  # ~10 of 400 words changed: most 5-shingles survive
        edited[i] = "edited"
    assert jaccard_estimate(" ".join(base), " ".join(edited)) > 0.7
    other = distinct_docs(2, seed=9, words_per_doc=400)[1]
    assert jaccard_estimate(" ".join(base), other) < 0.1
    # Case and whitespace do not make a document new.
    assert jaccard_estimate(" ".join(base), "  ".join(base).upper()) == 1.0


def verdicts(texts: list[str], batches: int = 1) -> list[str]:
    dedup = Deduplicator(near=True)
    out = []
    for chunk in np.array_split(np.arange(len(texts)), batches):
        keys = np.array([hash_key(texts[i]) for i in chunk], dtype=np.uint64)
        rows = np.array([near_row(texts[i], 5, 16, 8) for i in chunk]).reshape(len(chunk), -1)
        out += dedup.judge(keys, rows)
    return out


def hash_key(text: str) -> int:
    return digest_key(hashlib.sha256(text.encode()).digest())


def test_exact_and_near_duplicates_are_found_within_and_across_batches():
    docs = distinct_docs(20, words_per_doc=200)
    near = docs[3].split(" ")
    near[100] = "changed"
    texts = [*docs, docs[5], " ".join(near), docs[5]]
    for batches in (1, 3, len(texts)):
        assert verdicts(texts, batches) == [""] * 20 + ["duplicate", "near_duplicate", "duplicate"]


def test_short_documents_are_only_duplicates_of_their_own_words():
    assert verdicts(["one two", "One  two", "one three"]) == ["", "near_duplicate", ""]
