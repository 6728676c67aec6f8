"""Small corpora for the data-prep tests: distinct documents, and files in every format."""

from __future__ import annotations

import gzip
import json
import random
from pathlib import Path

import zstandard

from tests.conftest import write_corpus

_SYLLABLES = ["ka", "lo", "mi", "ren", "tu", "sa", "vo", "ne", "pi", "dor", "ex", "quo", "lin", "ba", "te", "ru"]


def words(rng: random.Random, n: int) -> str:
    return " ".join("".join(rng.choice(_SYLLABLES) for _ in range(rng.randint(1, 3))) for _ in range(n))


def distinct_docs(n: int, seed: int = 0, words_per_doc: int = 60) -> list[str]:
    """Documents that share a vocabulary but no near-duplicate pairs."""
    rng = random.Random(seed)
    return [f"Document {i}. {words(rng, words_per_doc)}." for i in range(n)]


def mixed_corpus(root: Path) -> tuple[Path, dict[str, int]]:
    """A folder with text, JSONL, gzip and problem files; returns it and the expected skips."""
    docs = distinct_docs(40)
    files: dict[str, str | bytes] = {f"doc{i}.txt": text for i, text in enumerate(docs[:30])}
    files["dup.txt"] = docs[0]  # exact duplicate
    near = docs[1].split(" ")
    near[5] = "changed"
    files["near.txt"] = " ".join(near)  # one word changed: a near-duplicate
    files["empty.txt"] = "   \n"
    files["short.txt"] = "tiny"
    files["latin1.txt"] = "caf\xe9 ".encode("latin-1") * 40
    files["blob.txt"] = b"\x00\x01binary" * 50
    files["nested/records.jsonl"] = "\n".join(
        [json.dumps({"text": text}) for text in docs[30:35]] + ["{not json", json.dumps({"other": 1})]
    )
    files["packed.txt.gz"] = gzip.compress(docs[35].encode())
    files["packed.jsonl.zst"] = zstandard.ZstdCompressor().compress(json.dumps({"text": docs[36]}).encode())
    files["broken.txt.gz"] = gzip.compress(b"x" * 1000)[:20]
    expected = {
        "duplicate": 1,
        "near_duplicate": 1,
        "empty": 1,
        "too_short": 1,
        "not_utf8": 1,
        "binary": 1,
        "bad_jsonl_record": 1,
        "jsonl_missing_text_field": 1,
        "bad_gzip": 1,
    }
    return write_corpus(root, files), expected


KEPT_IN_MIXED = 30 + 5 + 2  # text files, JSONL records, the gzip and zstd documents
