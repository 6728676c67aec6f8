"""Exact and near-duplicate detection: the hash set, MinHash estimates, LSH verdicts."""

import hashlib

import numpy as np

from data_prep.dedup import (
    CANDIDATES_PER_KEY,
    band_pairs,
    digest_key,
    near_drops,
    near_duplicates,
    near_row,
    repeated,
    shingle_hashes,
    signature,
)
from tests.helpers import distinct_docs


def test_a_bucket_pairs_each_document_with_its_first_candidates_only():
    n = 3 * CANDIDATES_PER_KEY
    later, earlier = band_pairs(np.full(n, 7, dtype=np.uint64), np.arange(n, dtype=np.uint64)[::-1].copy())
    # Document i meets documents 0 … min(i, 32) - 1 of its bucket, never the whole family.
    assert len(later) == sum(min(i, CANDIDATES_PER_KEY) for i in range(n))
    assert earlier.max() == CANDIDATES_PER_KEY - 1 and (later > earlier).all()


def test_a_large_family_of_alike_documents_is_judged_against_the_first_kept():
    base = distinct_docs(1, words_per_doc=300)[0]
    family = [f"{base} variant {i}" for i in range(3 * CANDIDATES_PER_KEY)]
    assert verdicts(family) == [""] + ["near_duplicate"] * (len(family) - 1)
    rows = np.array([near_row(t, 5, 16, 8) for t in family])
    dropped, rejected = near_duplicates(np.arange(len(family), dtype=np.uint64), rows, 16, 8, threshold=1.5)
    assert len(dropped) == 0 and rejected == len(family) - 1  # no estimate reaches 1.5: every one kept


def test_exact_duplicates_are_every_copy_but_the_first_by_id():
    keys = np.array([5, 9, 5, 5, 9, 1], dtype=np.uint64)
    ids = np.array([40, 3, 7, 12, 90, 2], dtype=np.uint64)
    assert repeated(keys, ids).tolist() == [12, 40, 90]


def test_a_chain_keeps_both_ends_when_they_are_unalike():
    # b is alike a (dropped); c is alike b only: b was dropped, so c is kept.
    later, earlier = np.array([2, 3, 3], dtype=np.uint64), np.array([1, 2, 1], dtype=np.uint64)
    dropped, rejected = near_drops(later, earlier, np.array([True, True, False]))
    assert dropped.tolist() == [2] and rejected == 1


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


def verdicts(texts: list[str]) -> list[str]:
    """Each document's verdict, as the stages give it: exact duplicates first, then near ones among the rest."""
    ids = np.arange(len(texts), dtype=np.uint64)
    keys = np.array([hash_key(t) for t in texts], dtype=np.uint64)
    exact = set(repeated(keys, ids).tolist())
    alive = np.array([i for i in range(len(texts)) if i not in exact], dtype=np.uint64)
    rows = np.array([near_row(texts[i], 5, 16, 8) for i in alive.tolist()])
    near = set(near_duplicates(alive, rows, 16, 8, 0.7)[0].tolist())
    return ["duplicate" if i in exact else "near_duplicate" if i in near else "" for i in range(len(texts))]


def hash_key(text: str) -> int:
    return digest_key(hashlib.sha256(text.encode()).digest())


def test_exact_and_near_duplicates_are_found():
    docs = distinct_docs(20, words_per_doc=200)
    near = docs[3].split(" ")
    near[100] = "changed"
    texts = [*docs, docs[5], " ".join(near), docs[5]]
    assert verdicts(texts) == [""] * 20 + ["duplicate", "near_duplicate", "duplicate"]


def test_short_documents_are_only_duplicates_of_their_own_words():
    assert verdicts(["one two", "One  two", "one three"]) == ["", "near_duplicate", ""]
