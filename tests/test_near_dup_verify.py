"""Near-duplicate verification: an LSH band hit is dropped only when the b-bit MinHash estimate of
its Jaccard similarity passes ``data.near_dup_threshold``. Ground truth is the exact Jaccard
similarity of the word 5-shingle sets, computed here."""

import random

import numpy as np
import pytest

from data_prep.dedup import band_pairs, near_drops, near_duplicates, near_row, similar
from data_prep.manifest import load_manifest
from data_prep.prepare import prepare_dataset
from storage import open_store
from tests.helpers import tiny_data, tiny_tokenizer, write_corpus

LEVELS = (0.5, 0.6, 0.7, 0.8, 0.9)
WORDS = 200
SHINGLE = 5


def fresh_words(rng: random.Random, n: int) -> list[str]:
    """Words from a space so large that unrelated documents share no shingle."""
    return ["".join(rng.choice("abcdefghijklmnopqrstuvwxyz") for _ in range(6)) for _ in range(n)]


def planted(base: list[str], similarity: float, rng: random.Random) -> list[str]:
    """A copy of ``base`` with its tail rewritten so that the shingle Jaccard similarity is about ``similarity``."""
    shingles = len(base) - SHINGLE + 1
    common = round(2 * shingles * similarity / (1 + similarity))  # |A∩B| / (2|A| - |A∩B|) = s
    keep = common + SHINGLE - 1
    return base[:keep] + fresh_words(rng, len(base) - keep)


def shingle_set(words: list[str]) -> set[tuple[str, ...]]:
    return {tuple(words[i : i + SHINGLE]) for i in range(len(words) - SHINGLE + 1)}


def jaccard(a: list[str], b: list[str]) -> float:
    sa, sb = shingle_set(a), shingle_set(b)
    return len(sa & sb) / len(sa | sb)


def planted_set(seed: int = 15) -> tuple[list[str], list[int], list[float]]:
    """2,000 documents: 800 originals, 160 planted near-duplicates at each level (after their
    original, shuffled), and 400 unrelated ones. Per document: its original's index (-1 for
    none) and the exact similarity to it."""
    rng = random.Random(seed)
    originals = [fresh_words(rng, WORDS) for _ in range(800)]
    copies = [(i, level) for level in LEVELS for i in rng.sample(range(800), 160)]
    docs: list[tuple[list[str], int, float]] = [(words, -1, 0.0) for words in originals]
    for i, level in copies:
        words = planted(originals[i], level, rng)
        docs.append((words, i, jaccard(originals[i], words)))
    docs += [(fresh_words(rng, WORDS), -1, 0.0) for _ in range(400)]
    tail = docs[800:]
    rng.shuffle(tail)  # originals first, so that every copy comes after its original
    docs[800:] = tail
    return [" ".join(w) for w, _, _ in docs], [o for _, o, _ in docs], [s for _, _, s in docs]


def judged(texts: list[str], threshold: float, shards: int = 1) -> tuple[list[str], int]:
    """Verdicts with the band entries cut into ``shards`` by key, as the near stage cuts them."""
    rows = np.array([near_row(t, SHINGLE, 16, 8) for t in texts])
    ids = np.arange(len(texts), dtype=np.uint64)
    keys, owners = rows[:, :16].ravel(), np.repeat(ids, 16)
    pairs = [band_pairs(keys[keys % np.uint64(shards) == s], owners[keys % np.uint64(shards) == s]) for s in range(shards)]
    both = np.unique(np.stack([np.concatenate([p[0] for p in pairs]), np.concatenate([p[1] for p in pairs])], axis=1), axis=0)
    sketches = np.ascontiguousarray(rows[:, 16:]).view(np.uint8)
    later, earlier = both[:, 0], both[:, 1]
    dropped, rejected = near_drops(
        later, earlier, similar(sketches[later.astype(np.intp)], sketches[earlier.astype(np.intp)], threshold)
    )
    gone = set(dropped.tolist())
    return ["near_duplicate" if i in gone else "" for i in range(len(texts))], rejected


def rates(verdicts: list[str], originals: list[int], exact: list[float]) -> dict:
    dropped = [i for i, v in enumerate(verdicts) if v == "near_duplicate"]
    by_level = {level: [i for i, o in enumerate(originals) if o >= 0 and abs(exact[i] - level) < 0.03] for level in LEVELS}
    return {
        "dropped": len(dropped),
        "below_0.65": sum(exact[i] < 0.65 for i in dropped),
        "precision_0.65": sum(exact[i] >= 0.65 for i in dropped) / max(len(dropped), 1),
        "recall": {level: sum(verdicts[i] == "near_duplicate" for i in ids) / len(ids) for level, ids in by_level.items()},
    }


@pytest.mark.slow
def test_verification_drops_the_similar_and_keeps_the_merely_proposed():
    texts, originals, exact = planted_set()
    unverified, _ = judged(texts, threshold=0.0)
    verified, rejected = judged(texts, threshold=0.7)
    before, after = rates(unverified, originals, exact), rates(verified, originals, exact)
    # LSH alone drops pairs well below the threshold; verified, none.
    assert before["below_0.65"] >= 50 and before["recall"][0.5] > 0.05
    assert after["below_0.65"] == 0 and after["precision_0.65"] == 1.0
    assert after["recall"][0.5] == after["recall"][0.6] == 0.0
    assert after["recall"][0.8] >= 0.9 and after["recall"][0.9] == 1.0
    assert 0.2 <= after["recall"][0.7] <= 0.8  # at the threshold: the estimate falls either side
    # Verification only ever keeps what LSH proposed; it counts what it kept.
    proposed_kept = [i for i, (u, v) in enumerate(zip(unverified, verified, strict=True)) if u and not v]
    assert all(v != "near_duplicate" or u == "near_duplicate" for u, v in zip(unverified, verified, strict=True))
    # (Verification keeps more documents, so more can be proposed later: at least those.)
    assert rejected >= len(proposed_kept) > 100
    assert sum(exact[i] < 0.7 for i in proposed_kept) >= len(proposed_kept) - 2
    # Originals and unrelated documents are never dropped.
    assert all(verified[i] == "" for i, o in enumerate(originals) if o < 0)


def test_verdicts_do_not_depend_on_the_shards():
    texts, _, _ = planted_set()
    texts = texts[:300] + texts[800:1100]
    one = judged(texts, 0.7)
    assert one[0].count("near_duplicate") > 20
    assert judged(texts, 0.7, shards=3) == judged(texts, 0.7, shards=7) == one
    # The stages' own composition, in one place, agrees.
    rows = np.array([near_row(t, SHINGLE, 16, 8) for t in texts])
    dropped, rejected = near_duplicates(np.arange(len(texts), dtype=np.uint64), rows, 16, 8, 0.7)
    assert [i for i, v in enumerate(one[0]) if v] == dropped.tolist() and rejected == one[1]


def banded_pair(base: list[str], similarity: float) -> list[str]:
    """A copy of ``base`` about ``similarity`` alike that shares an LSH band with it (the first of a
    fixed series of rewrites that does)."""
    for seed in range(1000):
        words = planted(base, similarity, random.Random(f"rewrite {seed}"))
        if (near_row(" ".join(words), SHINGLE, 16, 8)[:16] == near_row(" ".join(base), SHINGLE, 16, 8)[:16]).any():
            return words
    raise AssertionError("no rewrite shares a band")


@pytest.mark.parametrize("threshold", [0.7, 0.0])
def test_prepare_drops_the_similar_candidate_only(tmp_path, threshold):
    rng = random.Random(3)
    base = fresh_words(rng, WORDS)
    half, close = banded_pair(base, 0.5), planted(base, 0.9, rng)
    assert abs(jaccard(base, half) - 0.5) < 0.02 and abs(jaccard(base, close) - 0.9) < 0.02
    docs = {"a_base.txt": base, "b_half.txt": half, "c_close.txt": close}
    docs |= {f"d{i}.txt": fresh_words(rng, WORDS) for i in range(6)}
    corpus = write_corpus(tmp_path / "corpus", {name: " ".join(words) for name, words in docs.items()})
    data = tiny_data(sources=[str(corpus)], near_dup_threshold=threshold)
    store = open_store(str(tmp_path / "store"))
    ref = prepare_dataset(data, tiny_tokenizer(), store)
    stats, dropped = ref.stats, load_manifest(store, ref)["sources"]["skipped_examples"]["near_duplicate"]
    if threshold:
        assert dropped == ["c_close.txt"] and stats["near_duplicates_rejected_by_verification"] == 1
        assert stats["skipped_near_duplicate"] == 1 and stats["documents_kept"] == 8
    else:  # unverified: the half-alike document goes too
        assert dropped == ["b_half.txt", "c_close.txt"] and stats["near_duplicates_rejected_by_verification"] == 0
        assert stats["skipped_near_duplicate"] == 2 and stats["documents_kept"] == 7


def test_threshold_outside_0_1_is_a_settings_problem():
    assert any("data.near_dup_threshold is 1.5" in p for p in tiny_data(near_dup_threshold=1.5).problems())
    assert not [p for p in tiny_data(near_dup_threshold=0.0).problems() if "near_dup_threshold" in p]
