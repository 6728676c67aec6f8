"""Exact and near-duplicate detection with numpy: MinHash signatures, LSH bands, and a
compact hash set, so that the state costs a few hundred bytes per document.

Near-duplicates: a document's word ``k``-shingles are hashed (a polynomial rolling hash
over its lower-cased, whitespace-normalised UTF-8, vectorised with prefix sums), then
reduced to a MinHash signature by one-permutation hashing (one hash per shingle; the
signature slot is the hash modulo its length, empty slots filled from their right-hand
neighbour) — O(shingles), not O(shingles × permutations). The signature is cut into LSH
bands; a document whose band key matches one of any earlier document's (not counting
exact duplicates) is a near-duplicate. There is no pairwise verification: a pair with
Jaccard similarity s collides with probability ``1 - (1 - s**rows) ** bands``.
"""

from __future__ import annotations

import numpy as np

_U64 = np.uint64
_MASK = (1 << 64) - 1
_P = 0x100000001B3  # odd: invertible modulo 2**64
_P_INV = pow(_P, -1, 1 << 64)
_EMPTY = np.iinfo(np.uint64).max


def splitmix64(x: np.ndarray) -> np.ndarray:
    """A bijective 64-bit mixer (wrapping arithmetic on uint64 arrays)."""
    x = x + _U64(0x9E3779B97F4A7C15)
    x = (x ^ (x >> _U64(30))) * _U64(0xBF58476D1CE4E5B9)
    x = (x ^ (x >> _U64(27))) * _U64(0x94D049BB133111EB)
    return x ^ (x >> _U64(31))


def _powers(base: int, n: int) -> np.ndarray:
    out = np.full(n, base, dtype=np.uint64)
    out[0] = 1
    return np.cumprod(out, dtype=np.uint64)


def shingle_hashes(text: str, words: int) -> np.ndarray:
    """A 64-bit hash per run of ``words`` consecutive words (one for a shorter text)."""
    normal = " ".join(text.lower().split()).encode("utf-8")
    if not normal:
        return np.zeros(0, dtype=np.uint64)
    data = np.frombuffer(normal, dtype=np.uint8).astype(np.uint64) + _U64(1)
    n = len(data)
    prefix = np.zeros(n + 1, dtype=np.uint64)
    np.cumsum(data * _powers(_P, n), out=prefix[1:])
    bounds = np.concatenate([[0], np.flatnonzero(data == _U64(ord(" ") + 1)) + 1, [n + 1]])
    count = len(bounds) - 1  # words; bounds[i] is where word i starts (+1 past the end)
    if count <= words:
        starts, ends = np.array([0]), np.array([n])
    else:
        starts, ends = bounds[: count - words + 1], bounds[words:] - 1  # end before the separating space
    # Σ data[j]·P^j over the window, shifted to start at P^0: equal windows hash equal anywhere.
    window = (prefix[ends] - prefix[starts]) * _powers(_P_INV, int(starts[-1]) + 1)[starts]
    return splitmix64(window)


def signature(shingles: np.ndarray, length: int) -> np.ndarray:
    """One-permutation MinHash of the shingle hashes, densified: ``length`` uint64 values."""
    sig = np.full(length, _EMPTY, dtype=np.uint64)
    if len(shingles) == 0:
        return sig
    mixed = splitmix64(shingles ^ _U64(0x5851F42D4C957F2D))
    np.minimum.at(sig, (mixed % _U64(length)).astype(np.intp), mixed // _U64(length))
    empty = sig == _EMPTY
    if empty.any():
        full = np.flatnonzero(~empty)
        slots = np.flatnonzero(empty)
        donor = full[np.searchsorted(full, slots) % len(full)]
        distance = (donor - slots) % length
        sig[slots] = splitmix64(sig[donor] + distance.astype(np.uint64))
    return sig


def band_keys(sig: np.ndarray, bands: int, rows: int) -> np.ndarray:
    """One nonzero 64-bit key per band; the band index is mixed in, so bands never match each other."""
    table = sig.reshape(bands, rows)
    acc = splitmix64(np.arange(bands, dtype=np.uint64))
    for r in range(rows):
        acc = splitmix64(acc ^ table[:, r])
    acc[acc == 0] = 1
    return acc


def digest_key(digest: bytes) -> int:
    """A nonzero 64-bit key from a content digest."""
    return int.from_bytes(digest[:8], "little") or 1


class HashSet64:
    """An open-addressing set of nonzero uint64 keys (8 bytes a slot, at most half full),
    probed for whole arrays at once."""

    def __init__(self, capacity: int = 1 << 12) -> None:
        self._slots = np.zeros(capacity, dtype=np.uint64)
        self._size = 0

    def __len__(self) -> int:
        return self._size

    @property
    def nbytes(self) -> int:
        return self._slots.nbytes

    def _find(self, keys: np.ndarray) -> np.ndarray:
        """For each key, its slot if present, else the empty slot that ends its probe."""
        mask = _U64(len(self._slots) - 1)
        pos = (keys & mask).astype(np.intp)
        pending = np.arange(len(keys))
        while pending.size:
            held = self._slots[pos[pending]]
            done = (held == keys[pending]) | (held == 0)
            pending = pending[~done]
            pos[pending] = (pos[pending] + 1) & int(mask)
        return pos

    def contains(self, keys: np.ndarray) -> np.ndarray:
        return self._slots[self._find(keys)] == keys

    def add_new(self, keys: np.ndarray) -> None:
        """Insert distinct keys that are not in the set yet."""
        if 2 * (self._size + len(keys)) > len(self._slots):
            self._grow(2 * (self._size + len(keys)))
        self._size += len(keys)
        while keys.size:
            slots = self._find(keys)
            # Keys probing to the same empty slot: the first takes it, the rest probe on.
            _, first = np.unique(slots, return_index=True)
            self._slots[slots[first]] = keys[first]
            rest = np.ones(len(keys), dtype=bool)
            rest[first] = False
            keys = keys[rest]

    def _grow(self, needed: int) -> None:
        old = self._slots[self._slots != 0]
        capacity = len(self._slots)
        while capacity < needed:
            capacity *= 2
        self._slots = np.zeros(capacity, dtype=np.uint64)
        self._size = 0
        self.add_new(old)


class Deduplicator:
    """Verdicts for batches of documents in corpus order: ``""`` (new), ``duplicate`` (same
    cleaned text as an earlier one) or ``near_duplicate``."""

    def __init__(self, near: bool) -> None:
        self.near = near
        self._exact = HashSet64()
        self._bands = HashSet64()

    @property
    def nbytes(self) -> int:
        return self._exact.nbytes + self._bands.nbytes

    def judge(self, content_keys: np.ndarray, bands: np.ndarray | None) -> list[str]:
        n = len(content_keys)
        if n == 0:
            return []
        order = np.arange(n)
        unique, first, inverse = np.unique(content_keys, return_index=True, return_inverse=True)
        seen = self._exact.contains(unique)
        duplicate = seen[inverse] | (first[inverse] != order)
        self._exact.add_new(unique[~seen])
        near = np.zeros(n, dtype=bool)
        if self.near and bands is not None:
            candidates = np.flatnonzero(~duplicate)
            keys = bands[candidates]
            flat = keys.ravel()
            owner = np.repeat(np.arange(len(candidates)), keys.shape[1])
            unique, first, inverse = np.unique(flat, return_index=True, return_inverse=True)
            seen = self._bands.contains(unique)
            # A band key met before: in an earlier batch, or earlier in this one.
            hit = seen[inverse] | (owner[first[inverse]] != owner)
            near[candidates] = np.logical_or.reduceat(hit, np.arange(0, len(flat), keys.shape[1])) if len(flat) else False
            self._bands.add_new(unique[~seen])
        return ["duplicate" if d else "near_duplicate" if m else "" for d, m in zip(duplicate, near, strict=True)]
