"""De-duplication across the components of a mixture: a stage of its own, after every component is prepared.

Each component was de-duplicated on its own. A document of a later component that is an exact or near
duplicate of a document of an earlier one (the order of ``data.mixture``) is counted as
``cross_component_duplicate`` and its rows leave the blend: an exclusion list that ``blend_dataset``
applies, the component datasets untouched (so that editing one component prepares that one, and reruns
this stage, and nothing else).

- **Exact**: the documents' sha256 in each dataset's doc stats (checked against its manifest).
- **Near**: the MinHash bands and b-bit sketches of ``data_prep.dedup``, with the mixture's global
  ``shingle_words``/``minhash_*``/``near_dup_threshold``, of each document's text decoded from its tokens
  (the text the component kept, exactly: byte-level BPE), over candidate pairs from two components only.

A packed row holds parts of several documents: a row leaves when more than half of its tokens belong to
excluded documents. The stage reads one component's split at a time into memory (the CPU presets';
a corpus of many GB would want the scan's signatures kept with the dataset instead).
"""

from __future__ import annotations

import csv
import hashlib
import io
import json
import logging
from dataclasses import dataclass

import numpy as np
from tokenizers import Tokenizer

from common.contracts import DatasetRef
from data_prep.blend_dataset import REASON
from data_prep.dedup import band_pairs, near_drops, near_row, similar
from data_prep.errors import DataError
from data_prep.manifest import load_manifest, read_recorded, stored_shards
from data_prep.shards import read_rows
from storage import Store

log = logging.getLogger(__name__)

EXCLUSIONS = "mixtures/exclusions"
_COMPONENT_BITS = 40  # a document's id: its component in the high bits, its index in the low ones


@dataclass(frozen=True)
class NearSettings:
    """The mixture's near-duplicate settings (``data.*``), or None for exact duplicates only."""

    shingle_words: int
    bands: int
    rows: int
    threshold: float


@dataclass
class _Docs:
    """One component's kept documents, in the order its splits' token streams hold them."""

    sha256: list[str]
    split: list[str]
    tokens: np.ndarray
    """Each document's tokens, its end-of-document token included."""


def _doc_stats(store: Store, ref: DatasetRef, manifest: dict) -> _Docs:
    data = read_recorded(store, ref, "doc_stats", manifest)
    rows = list(csv.reader(io.StringIO(data.decode(), newline="")))[1:]
    return _Docs([r[1] for r in rows], [r[2] for r in rows], np.asarray([int(r[4]) + 1 for r in rows], dtype=np.int64))


def _spans(docs: _Docs, split: str) -> tuple[np.ndarray, np.ndarray]:
    """The documents of ``split`` (indices) and their token starts in the split's stream."""
    members = np.flatnonzero(np.asarray(docs.split) == split)
    return members, np.concatenate([[0], np.cumsum(docs.tokens[members])])


def excluded_rows(docs: _Docs, dropped: set[int], split: str, rows: int, row_len: int) -> list[int]:
    """The split's rows of which more than half the tokens belong to ``dropped`` documents."""
    members, starts = _spans(docs, split)
    owned = np.zeros(rows * row_len + 1, dtype=np.int64)  # +1 at each dropped span's start, -1 at its end
    for k, doc in enumerate(members.tolist()):
        if doc in dropped:
            lo, hi = min(starts[k], rows * row_len), min(starts[k + 1], rows * row_len)
            owned[lo] += 1
            owned[hi] -= 1
    per_token = np.cumsum(owned)[: rows * row_len].reshape(rows, row_len)
    return np.flatnonzero(per_token.sum(axis=1) * 2 > row_len).tolist()


def _texts(store: Store, ref: DatasetRef, manifest: dict, docs: _Docs, tokenizer: Tokenizer) -> dict[int, str]:
    """Each document's text, decoded from its tokens (documents cut off by the last row's end are left out)."""
    texts = {}
    for split in ("train", "val"):
        stream = read_rows(stored_shards(store, ref, manifest, split)).ravel()
        members, starts = _spans(docs, split)
        for k, doc in enumerate(members.tolist()):
            if starts[k + 1] <= len(stream):
                texts[doc] = tokenizer.decode(stream[starts[k] : starts[k + 1] - 1].tolist())
    return texts


def _near(
    store: Store,
    datasets: list[DatasetRef],
    manifests: list[dict],
    all_docs: list[_Docs],
    exact: list[set[int]],
    near: NearSettings,
) -> list[set[int]]:
    """The documents of each component that are near duplicates of an earlier component's."""
    tokenizer = Tokenizer.from_str(read_recorded(store, datasets[0], "tokenizer", manifests[0]).decode())
    ids, rows = [], []
    for c, (ref, manifest, docs) in enumerate(zip(datasets, manifests, all_docs, strict=True)):
        for doc, text in _texts(store, ref, manifest, docs, tokenizer).items():
            if doc not in exact[c]:
                ids.append(c << _COMPONENT_BITS | doc)
                rows.append(near_row(text, near.shingle_words, near.bands, near.rows))
    found: list[set[int]] = [set() for _ in datasets]
    if not ids:
        return found
    doc_ids, table = np.asarray(ids, dtype=np.uint64), np.stack(rows)
    later, earlier = band_pairs(np.ascontiguousarray(table[:, : near.bands]).ravel(), np.repeat(doc_ids, near.bands))
    across = (later >> np.uint64(_COMPONENT_BITS)) != (earlier >> np.uint64(_COMPONENT_BITS))
    later, earlier = later[across], earlier[across]
    sketches = np.ascontiguousarray(table[:, near.bands :]).view(np.uint8)[:, : near.bands * near.rows]
    place = {int(i): k for k, i in enumerate(doc_ids.tolist())}
    a = sketches[[place[int(i)] for i in later.tolist()]]
    b = sketches[[place[int(i)] for i in earlier.tolist()]]
    dropped, _ = near_drops(later, earlier, similar(a, b, near.threshold))
    for doc_id in dropped.tolist():
        found[doc_id >> _COMPONENT_BITS].add(doc_id & ((1 << _COMPONENT_BITS) - 1))
    return found


def cross_component_duplicates(store: Store, datasets: list[DatasetRef], near: NearSettings | None) -> dict:
    """Per component (in mixture order): the documents that duplicate an earlier component's, by kind,
    and the rows of each split they take out of the blend."""
    manifests = [load_manifest(store, ref) for ref in datasets]
    all_docs = [_doc_stats(store, ref, m) for ref, m in zip(datasets, manifests, strict=True)]
    first: dict[str, int] = {}
    exact: list[set[int]] = []
    for c, docs in enumerate(all_docs):
        exact.append({i for i, sha in enumerate(docs.sha256) if first.setdefault(sha, c) != c})
    near_found = _near(store, datasets, manifests, all_docs, exact, near) if near else [set() for _ in datasets]
    out = []
    for ref, manifest, docs, e, n in zip(datasets, manifests, all_docs, exact, near_found, strict=True):
        row_len = int(manifest["seq_len"]) + 1
        rows = {s: excluded_rows(docs, e | n, s, int(manifest["splits"][s]["sequences"]), row_len) for s in ("train", "val")}
        out.append({"dataset": ref.version, "exact": len(e), "near": len(n), "rows": rows})
    return {"reason": REASON, "near": near is not None, "components": out}


def commit_exclusions(store: Store, found: dict) -> str:
    """Write the exclusion list under its content's hash; its key."""
    data = json.dumps(found, sort_keys=True).encode()
    key = f"{EXCLUSIONS}/{hashlib.sha256(data).hexdigest()[:16]}.json"
    if not store.exists(key):
        store.put_bytes(key, data)
    for part in found["components"][1:]:
        if part["exact"] or part["near"]:
            log.info(
                "dataset %s: %s exact and %s near duplicates of an earlier component (%s train rows left out)",
                part["dataset"],
                part["exact"],
                part["near"],
                len(part["rows"]["train"]),
            )
    return key


def load_exclusions(store: Store, key: str) -> dict:
    """An exclusion list, checked to hash to its key's name (a bucket writer cannot swap it unseen)."""
    data = store.get_bytes(key)
    if not key.endswith(f"/{hashlib.sha256(data).hexdigest()[:16]}.json"):
        raise DataError(f"{store.url(key)} does not hash to its name: it was modified; run the pipeline again")
    return json.loads(data)
