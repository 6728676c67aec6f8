"""Exact and near-duplicate detection with numpy: MinHash signatures, LSH bands, b-bit sketches
and compact hash tables, so that the state costs a few hundred bytes per document.

Near-duplicates: a document's word ``k``-shingles are hashed (a polynomial rolling hash
over its lower-cased, whitespace-normalised UTF-8, vectorised with prefix sums), then
reduced to a MinHash signature by one-permutation hashing (one hash per shingle; the
signature slot is the hash modulo its length, empty slots filled from their right-hand
neighbour) — O(shingles), not O(shingles × permutations). The signature is cut into LSH
bands: a pair with Jaccard similarity s shares a band with probability
``1 - (1 - s**rows) ** bands`` (16 × 8: 6% at s = 0.5, 24% at 0.6, 64% at 0.7, 95% at 0.8).

A band hit is only a candidate. It is verified against the earlier kept document that owns
the band key, with a **b-bit MinHash** sketch (Li & König 2010): the low ``SKETCH_BITS`` = 8
bits of each of the ``bands × rows`` signature values, 128 bytes a kept document instead of
1 KB of full 64-bit values. Two values agree with probability ``P = J + (1 - J) · C``, where
``C = 2**-b`` is the chance that different minima agree in their low b bits (the large-universe
limit of Li & König's correction); so from the share ``m / n`` of the ``n = bands × rows``
bytes that agree, ``Ĵ = (m / n - C) / (1 - C)``. Its standard error is
``sqrt(P (1 - P) / n) / (1 - C)``: ±0.04 at J = 0.7 and 0.6, ±0.035 at 0.8, ±0.027 at 0.9
(16 × 8; measured on the planted pairs of tests/test_near_dup_verify.py: ±0.038, ±0.040, ±0.033,
±0.024, unbiased within 0.006). A proposed pair agrees in its colliding band by construction,
which could bias the estimate up by at most ``(1 - J) / bands`` (+0.019 at 0.7); measured on
the proposed pairs, +0.008 at 0.7 and +0.001 at 0.8. Leaving that band out measured worse
(-0.011 … -0.027: the bands before the first hit are known not to collide). The candidate is
dropped as ``near_duplicate`` when ``Ĵ ≥ data.near_dup_threshold``; ``0`` drops every
candidate unverified (the behaviour before verification).
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


class _Slots:
    """Open addressing over a power-of-two array of uint64 slots (0: empty), kept at most half full."""

    def __init__(self, capacity: int = 1 << 12) -> None:
        self._slots = np.zeros(capacity, dtype=np.uint64)
        self._size = 0

    def __len__(self) -> int:
        return self._size

    @property
    def nbytes(self) -> int:
        return self._slots.nbytes

    def _make_room(self, adding: int) -> np.ndarray:
        """Before ``adding`` more entries: the held entries, removed to be inserted again, if the table
        had to double (once or more) to stay half empty; else none."""
        needed = 2 * (self._size + adding)
        if needed <= len(self._slots):
            return self._slots[:0]
        old = self._slots[self._slots != 0]
        capacity = len(self._slots)
        while capacity < needed:
            capacity *= 2
        self._slots = np.zeros(capacity, dtype=np.uint64)
        self._size = 0
        return old


class HashSet64(_Slots):
    """An open-addressing set of nonzero uint64 keys (8 bytes a slot, at most half full),
    probed for whole arrays at once."""

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
        old = self._make_room(len(keys))
        if old.size:
            self.add_new(old)
        self._size += len(keys)
        while keys.size:
            slots = self._find(keys)
            # Keys probing to the same empty slot: the first takes it, the rest probe on.
            _, first = np.unique(slots, return_index=True)
            self._slots[slots[first]] = keys[first]
            rest = np.ones(len(keys), dtype=bool)
            rest[first] = False
            keys = keys[rest]


class BandOwners(_Slots):
    """Band key → the kept documents that had it (up to ``OWNERS_PER_KEY``), in 8 bytes an entry
    (open addressing, at most half full): the key's high 32 bits as a fingerprint and the owner's
    32-bit index. A key's entries lie in its probe run, before the first empty slot.

    Two keys with the same fingerprint share entries. That is harmless here: every owner found is
    verified against its sketch, so a false match costs one comparison, never a wrong drop. It
    bounds one table to 2**32 kept documents, and false matches grow as entries approach 2**32.
    """

    @staticmethod
    def fingerprints(keys: np.ndarray) -> np.ndarray:
        fps = keys >> _U64(32)
        fps[fps == 0] = 1  # an entry is never 0: 0 marks an empty slot
        return fps

    def owners(self, keys: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Every (key index, owner) pair the table holds for ``keys``, grouped by key index."""
        fps = self.fingerprints(keys)
        mask = len(self._slots) - 1
        pos = (fps & _U64(mask)).astype(np.intp)
        pending = np.arange(len(fps))
        found_at, found_owner = [np.zeros(0, dtype=np.intp)], [np.zeros(0, dtype=np.int64)]
        while pending.size:
            held = self._slots[pos[pending]]
            match = (held >> _U64(32)) == fps[pending]
            found_at.append(pending[match])
            found_owner.append((held[match] & _U64(0xFFFFFFFF)).astype(np.int64))
            pending = pending[held != 0]
            pos[pending] = (pos[pending] + 1) & mask
        at, owner = np.concatenate(found_at), np.concatenate(found_owner)
        order = np.argsort(at, kind="stable")
        return at[order], owner[order]

    def add(self, keys: np.ndarray, owners: np.ndarray) -> None:
        """Add an entry per (key, owner) pair."""
        old = self._make_room(len(keys))
        if old.size:
            self._insert(old)
        self._insert(self.fingerprints(keys) << _U64(32) | owners.astype(np.uint64))

    def _insert(self, entries: np.ndarray) -> None:
        """Each entry into the empty slot that ends its probe run (room is there)."""
        self._size += len(entries)
        mask = len(self._slots) - 1
        pos = ((entries >> _U64(32)) & _U64(mask)).astype(np.intp)
        while entries.size:
            held = self._slots[pos]
            busy = held != 0
            pos[busy] = (pos[busy] + 1) & mask
            free = np.flatnonzero(~busy)
            # Entries reaching the same empty slot: the first takes it, the rest probe on.
            _, first = np.unique(pos[free], return_index=True)
            taken = free[first]
            self._slots[pos[taken]] = entries[taken]
            rest = np.ones(len(entries), dtype=bool)
            rest[taken] = False
            entries, pos = entries[rest], pos[rest]


SKETCH_BITS = 8
OWNERS_PER_KEY = 8
_CHANCE = 2.0**-SKETCH_BITS  # different minima agree in their low bits this often


def sketch_words(bands: int, rows: int) -> int:
    """uint64 words holding a b-bit sketch of ``bands × rows`` bytes."""
    return -(-bands * rows // 8)


def near_row(text: str, shingle_words: int, bands: int, rows: int) -> np.ndarray:
    """What the parent needs to judge a document's near-duplicates, as one uint64 row (cheap to
    send from a worker): the ``bands`` LSH keys, then the b-bit sketch (the low byte of each
    signature value) packed 8 bytes a word."""
    sig = signature(shingle_hashes(text, shingle_words), bands * rows)
    row = np.zeros(bands + sketch_words(bands, rows), dtype=np.uint64)
    row[:bands] = band_keys(sig, bands, rows)
    row[bands:].view(np.uint8)[: bands * rows] = sig.astype(np.uint8)
    return row


def estimated_jaccard(a: np.ndarray, b: np.ndarray) -> float:
    """Jaccard similarity estimated from two b-bit sketches (see the module docstring)."""
    return (int(np.count_nonzero(a == b)) / len(a) - _CHANCE) / (1 - _CHANCE)


class Deduplicator:
    """Verdicts for batches of documents in corpus order: ``""`` (new), ``duplicate`` (same
    cleaned text as an earlier one) or ``near_duplicate`` (an LSH band shared with an earlier kept
    document, and an estimated Jaccard similarity with it of at least ``threshold``).

    The verdicts are those of judging one document at a time in corpus order, whatever the
    batches: a document is compared with the earlier kept documents that share one of its band
    keys (up to ``OWNERS_PER_KEY`` a key, the first ones), and if kept, joins its keys' owners."""

    def __init__(self, near: bool, bands: int = 16, rows: int = 8, threshold: float = 0.7) -> None:
        self.near, self.bands, self.rows, self.threshold = near, bands, rows, threshold
        self._exact = HashSet64()
        self._owners = BandOwners()
        self._sketches = np.zeros((1024 if near else 0, bands * rows), dtype=np.uint8)
        self._kept = 0
        self.rejected_candidates = 0
        """Documents that shared a band with an earlier kept one but were kept: verification said no."""

    @property
    def nbytes(self) -> int:
        return self._exact.nbytes + self._owners.nbytes + self._sketches.nbytes

    def judge(self, content_keys: np.ndarray, near_rows: np.ndarray | None) -> list[str]:
        """``near_rows``: one ``near_row`` per document (``None`` without near-dup detection)."""
        n = len(content_keys)
        if n == 0:
            return []
        order = np.arange(n)
        unique, first, inverse = np.unique(content_keys, return_index=True, return_inverse=True)
        seen = self._exact.contains(unique)
        duplicate = seen[inverse] | (first[inverse] != order)
        self._exact.add_new(unique[~seen])
        near = np.zeros(n, dtype=bool)
        if self.near and near_rows is not None:
            candidates = np.flatnonzero(~duplicate)
            near[candidates] = self._judge_near(near_rows[candidates])
        return ["duplicate" if d else "near_duplicate" if m else "" for d, m in zip(duplicate, near, strict=True)]

    def _judge_near(self, rows: np.ndarray) -> np.ndarray:
        count, bands = len(rows), self.bands
        keys = np.ascontiguousarray(rows[:, :bands])
        sketches = np.ascontiguousarray(rows[:, bands:]).view(np.uint8)[:, : bands * self.rows]
        flat = keys.ravel()
        at, owner = self._owners.owners(flat)
        held = np.bincount(at, minlength=len(flat))  # owners per (document, band)
        starts = np.concatenate([[0], np.cumsum(held)])
        _, inverse, counts = np.unique(flat, return_inverse=True, return_counts=True)
        shared = counts[inverse.ravel()] > 1
        # Most documents meet no band key, here or before: kept, and their keys are theirs alone.
        involved = ((held > 0) | shared).reshape(count, bands).any(axis=1)
        plain = np.flatnonzero(~involved)
        new_keys, new_owners = [keys[plain].ravel()], [np.repeat(self._store(sketches[plain]), bands)]
        # The rest one at a time, in order: whether a document is kept decides what its keys hold.
        drop = np.zeros(count, dtype=bool)
        claimed: dict[int, list[int]] = {}  # band key → kept documents of this batch that had it
        for i in np.flatnonzero(involved).tolist():
            row_keys = keys[i].tolist()
            candidates: set[int] = set()
            for band, key in enumerate(row_keys):
                j = i * bands + band
                candidates.update(owner[starts[j] : starts[j + 1]].tolist(), claimed.get(key, ()))
            if candidates and self._similar(sketches[i], candidates):
                drop[i] = True
                continue
            self.rejected_candidates += bool(candidates)
            own = int(self._store(sketches[i : i + 1])[0])
            for band, key in enumerate(row_keys):
                holders = claimed.setdefault(key, [])
                # A bounded number of owners a key: a large family of alike documents costs
                # at most OWNERS_PER_KEY comparisons a band, not one per member.
                if held[i * bands + band] + len(holders) < OWNERS_PER_KEY:
                    holders.append(own)
        pairs = [(key, o) for key, holders in claimed.items() for o in holders]
        if pairs:
            new_keys.append(np.array([k for k, _ in pairs], dtype=np.uint64))
            new_owners.append(np.array([o for _, o in pairs], dtype=np.int64))
        self._owners.add(np.concatenate(new_keys), np.concatenate(new_owners))
        return drop

    def _similar(self, sketch: np.ndarray, candidates: set[int]) -> bool:
        if self.threshold <= 0:
            return True  # unverified: every LSH candidate is a near-duplicate
        # In index order: the same comparisons whatever order the candidates were met in.
        return any(estimated_jaccard(sketch, self._sketches[owner]) >= self.threshold for owner in sorted(candidates))

    def _store(self, sketches: np.ndarray) -> np.ndarray:
        """Keep sketches of kept documents; their owner indices."""
        start, end = self._kept, self._kept + len(sketches)
        if end > len(self._sketches):
            grown = np.zeros((max(2 * len(self._sketches), end), self._sketches.shape[1]), dtype=np.uint8)
            grown[:start] = self._sketches[:start]
            self._sketches = grown
        self._sketches[start:end] = sketches
        self._kept = end
        return np.arange(start, end, dtype=np.int64)
