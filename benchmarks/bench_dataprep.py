"""Our prepare step against datatrove 0.10.1 on the same corpus: MB/s per core and keep/drop agreement.

    python benchmarks/bench_dataprep.py [--mb 40] [--prose-share 0.5] [--repeats 3] [--workers 2] [--quick]

Needs the ``bench`` extra (``pip install -c requirements.lock -e ".[bench]"``: datatrove, and
spaCy, the word tokenizer datatrove uses for English).

Corpus (deterministic, from this machine's files): Python source (the standard library, then
site-packages ``.py`` files to reach the size), English prose (``.md``/``.rst``/``.txt`` under
site-packages and plain-text files under /usr/share/doc) and planted near-duplicates (edited
copies of 4% of the documents, placed later in the corpus), shuffled with a fixed seed into
4 MB JSONL files with ``id`` and ``text`` fields. Both pipelines read the same files. Prose fills
``--prose-share`` (0.5) of the originals first, then code: the share of the corpus' text bytes
that is prose, planted copies included, is measured (``corpus.prose_share``, ``prose_mb``,
``code_mb``) and a corpus below the share it claims is refused (``BenchmarkCheckError``).

* **ours**: ``data_prep.prepare.prepare_dataset`` end to end on a local store: read, clean
  (NFC), PII redaction (defaults), Gopher repetition and quality rules at datatrove's default
  thresholds, exact and verified MinHash near-dup dedup (5-word shingles, 16 bands × 8 rows),
  BPE training, tokenization, packing, WebDataset shards, manifest; ``data.workers`` processes.
* **datatrove_ws**, the like-for-like peer: ``LocalPipelineExecutor`` stages, the same number of
  worker processes: JsonlReader → GopherRepetitionFilter → GopherQualityFilter (defaults,
  exclusion writers) → JsonlWriter + MinhashDedupSignature → MinhashDedupBuckets →
  MinhashDedupCluster → JsonlReader → MinhashDedupFilter (exclusion writer) → DocumentTokenizer
  with the tokenizer.json ours trained (HF tokenizers). Words are split at whitespace
  (``WhitespaceWords``, as ours) in the filters and the shingles. MinHash runs with datatrove's
  default ``MinhashConfig`` hashing (64-bit xxhash), only the shingle size, bands and rows set
  to ours (5 words, 16 buckets × 8 hashes). Datatrove 0.10.1 hands xxhash a ``str``, which
  xxhash 3 encoded as UTF-8 and xxhash 4 (our lock's) refuses: the datatrove runs replace its
  two xxhash wrappers with ones that encode first (same hashes; one ``str.encode`` a shingle).
* **datatrove_spacy**: the same pipeline with datatrove's English default word tokenizer,
  spaCy's, which makes punctuation marks words of their own: most of datatrove's time, and its
  Gopher rules then drop far more documents than ours. Reported beside the headline, not as it.

Headline: ``ours_vs_datatrove_like_for_like_per_core``, ours' MB/s per core over datatrove_ws's
(same word splitting, same rule set), the median of the per-repeat ratios, each pairing the two
runs of one repeat; ``spread`` is their min and max. ``ours_vs_datatrove_spacy_per_core`` the
same against datatrove_spacy. The rule set is the same as each side implements it: ours also
counts ``*`` bullets, strips punctuation off stop words, and sums ``#`` and ellipses in one
ratio (data_prep/quality.py); the agreement shows what that changes.

Timing: throughput is corpus file bytes / the pipeline's wall seconds (in its process, imports
excluded) / worker processes. Datatrove's exclusion writers (JSONL of every dropped document)
run inside its timed window, as datatrove ships them and a user runs it; the agreement reads
them. Ours does more in its window than datatrove: NFC, PII redaction, exact dedup, verified
near-dup, BPE training (datatrove is handed the trained tokenizer), packing, shards, manifest.

Order: one untimed run of ours first (a warm-up, which also trains the tokenizer.json
datatrove's DocumentTokenizer loads), then every repeat runs the three variants, each in a
fresh process, in an order rotated by one each repeat (repeat r starts with variant r mod 3).

Checks, each a ``BenchmarkCheckError`` (nothing is reported): every run exits 0; every run read
all the corpus' documents; every run kept documents and wrote tokens; each pipeline keeps the
same number of documents in every repeat; datatrove's exclusion writers hold every document its
steps dropped; our verdicts (``filtered_text`` with the same config) match the prepare step's
counters rule by rule and its kept documents (``doc_stats.csv``).

Agreement, document by document (by id), for each pair of ours with a datatrove run (from its
first repeat): per rule class, among the documents both submitted to that class (a document one
side dropped earlier is left out of later classes), and overall, the counts kept by both,
dropped by both, by ours only, by datatrove only. Where the like-for-like agreement of a class is
below 0.99, the first disagreeing documents are printed with both reasons. Last line: one JSON
object (``ratios``, ``spread``, ``agreement``, ...).
"""

from __future__ import annotations

import argparse
import csv
import gzip
import json
import os
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

from machine_info import BenchmarkCheckError, machine, ratio_keys, require  # benchmarks/ (the script's folder)

ROOT = Path(__file__).resolve().parents[1]
FILE_BYTES = 4 << 20
MIN_CHARS, MAX_CHARS = 200, 400_000  # documents outside are not picked (no length filter decides anything)
PLANTED_SHARE = 0.04
PROSE_SHARE = 0.5
"""The least share of the corpus' text bytes that is prose (--prose-share): filled first, measured, refused below."""
CLASSES = ("gopher_repetition", "gopher_quality", "near_duplicate")
# Datatrove's GopherRepetitionFilter defaults (Gopher, Table A1), in our settings' terms.
GOPHER_REPETITION = {
    "max_dup_lines": 0.3,
    "max_dup_paragraphs": 0.3,
    "max_dup_line_chars": 0.2,
    "max_dup_paragraph_chars": 0.2,
    "max_top_ngram_chars": [0.2, 0.18, 0.16],
    "max_dup_ngram_chars": [0.15, 0.14, 0.13, 0.12, 0.11, 0.10],
}
BANDS, ROWS, SHINGLE_WORDS = 16, 8, 5


# --- corpus -----------------------------------------------------------------------------
def _candidates() -> dict[str, list[Path]]:
    """Files by kind, in a stable order."""
    sys.path.insert(0, str(ROOT))
    from data_prep.sources import _stdlib_files

    site = Path(sys.prefix) / "lib" / f"python{sys.version_info.major}.{sys.version_info.minor}" / "site-packages"
    prose = sorted(p for p in site.rglob("*") if p.suffix.lower() in (".md", ".rst", ".txt") and p.is_file())
    doc = Path("/usr/share/doc")
    if doc.is_dir():
        prose += sorted(
            p for p in doc.rglob("*") if p.is_file() and not p.is_symlink() and p.suffix not in (".gz", ".html", ".png")
        )
    code = _stdlib_files() + sorted(p for p in site.rglob("*.py") if p.is_file())
    return {"prose": prose, "code": code}


def _read(path: Path) -> str | None:
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError):
        return None
    return text if MIN_CHARS <= len(text) <= MAX_CHARS and "\x00" not in text else None


def _edited(text: str, rng: random.Random) -> str:
    """A near-duplicate: one line in 12 gets a word replaced, one line deleted (Jaccard of 5-word
    shingles with the original mostly 0.6–0.9, so both sides of the 0.7 threshold are exercised)."""
    lines = text.split("\n")
    if len(lines) > 3:
        del lines[rng.randrange(len(lines))]
    for i in range(len(lines)):
        words = lines[i].split(" ")
        if rng.random() < 1 / 12 and len(words) > 1:
            words[rng.randrange(len(words))] = rng.choice(("foo", "data", "value", "the", "item"))
            lines[i] = " ".join(words)
    return "\n".join(lines)


def build_corpus(root: Path, total_bytes: int, seed: int = 0, prose_share: float = PROSE_SHARE) -> dict:
    """JSONL files of ``{"id", "text"}`` records; returns what the agreement needs to know and the
    corpus' make-up (text bytes by kind)."""
    rng = random.Random(seed)
    groups = _candidates()
    docs: list[tuple[str, str, str]] = []  # id, kind, text
    size = 0
    # Prose first (prose_share of the originals), then code up to the size: prose is what the Gopher rules are for.
    for kind, share in (("prose", prose_share), ("code", 1.0)):
        paths = groups[kind]
        for path in paths:
            if size >= share * total_bytes / (1 + PLANTED_SHARE):
                break
            text = _read(path)
            if text is None:
                continue
            docs.append((f"{kind[0]}{len(docs):06d}", kind, text))
            size += len(text.encode())
    rng.shuffle(docs)
    # Planted copies come after their originals: both pipelines keep the first of a pair.
    order: list[tuple[str, str, str]] = list(docs)
    planted = rng.sample(range(len(docs)), int(PLANTED_SHARE * len(docs)))
    for at in sorted(planted, reverse=True):
        doc_id, kind, text = docs[at]
        order.insert(rng.randrange(at + 1, len(order) + 1), (f"{doc_id}-copy", kind, _edited(text, rng)))
    root.mkdir(parents=True, exist_ok=True)
    files: list[list[str]] = []
    lines: list[str] = []
    used = 0
    for doc_id, _, text in order:
        line = json.dumps({"id": doc_id, "text": text})
        lines.append(line)
        used += len(line)
        if used >= FILE_BYTES:
            files.append(_write(root, len(files), lines))
            lines, used = [], 0
    if lines:
        files.append(_write(root, len(files), lines))
    kinds = {doc_id: kind for doc_id, kind, _ in order}
    by_kind = Counter()
    for _, kind, text in order:
        by_kind[kind] += len(text.encode())
    return {
        "files": files,
        "kinds": kinds,
        "documents": len(order),
        "planted": len(planted),
        "prose_documents": sum(k == "prose" for k in kinds.values()),
        "bytes": sum(p.stat().st_size for p in root.iterdir()),
        "text_bytes": sum(len(t.encode()) for _, _, t in order),
        "prose_bytes": by_kind["prose"],
        "code_bytes": by_kind["code"],
    }


def _write(root: Path, index: int, lines: list[str]) -> list[str]:
    (root / f"part-{index:05d}.jsonl").write_text("\n".join(lines) + "\n", encoding="utf-8")
    return [json.loads(line)["id"] for line in lines]


# --- ours ---------------------------------------------------------------------------------
QUALITY = {"gopher": {"enabled": True}, "repetition": {"enabled": True, **GOPHER_REPETITION}}
"""Ours' ``data.quality``, as it differs from the defaults: Gopher's document rules at their defaults (datatrove's), all
13 repetition rules at Gopher's thresholds."""


def ours_config(corpus: str, workers: int):
    from data_prep.config import DataConfig, GopherConfig, QualityConfig, RepetitionConfig

    quality = QualityConfig(gopher=GopherConfig(**QUALITY["gopher"]), repetition=RepetitionConfig(**QUALITY["repetition"]))
    return DataConfig(
        sources=[corpus],
        workers=workers,
        quality=quality,
        near_dedup=True,
        shingle_words=SHINGLE_WORDS,
        minhash_bands=BANDS,
        minhash_rows=ROWS,
    )


def child_ours(corpus: str, store: str, workers: int) -> dict:
    from data_prep.config import TokenizerConfig
    from data_prep.prepare import prepare_dataset
    from storage import open_store

    config = ours_config(corpus, workers)
    start = time.perf_counter()
    ref = prepare_dataset(config, TokenizerConfig(), open_store(store))
    return {"seconds": time.perf_counter() - start, "version": ref.version, "stats": ref.stats}


# --- datatrove ----------------------------------------------------------------------------
try:
    from datatrove.utils.word_tokenizers import WordTokenizer
    from xxhash import xxh32_intdigest, xxh64_intdigest
except ImportError:  # without the bench extra: main() says so
    WordTokenizer = object


class WhitespaceWords(WordTokenizer):
    """A datatrove word tokenizer that splits at whitespace, as ours does: with it, the
    disagreements left are the rules' own, not the word tokenizer's (datatrove's English
    default is spaCy's, which makes punctuation marks words of their own)."""

    def __init__(self) -> None:
        super().__init__("en")

    def word_tokenize(self, text: str) -> list[str]:
        return text.split()

    def sent_tokenize(self, text: str) -> list[str]:
        return [line for line in text.splitlines() if line.strip()]

    def span_tokenize(self, text: str) -> list[tuple[int, int]]:
        return [(0, len(text))]


def utf8_xxhash32(data: str | bytes) -> int:
    """Datatrove's ``xxhash32`` as it ran on xxhash 3: a ``str`` hashed as its UTF-8 bytes."""
    return xxh32_intdigest(data.encode() if isinstance(data, str) else data)


def utf8_xxhash64(data: str | bytes) -> int:
    """Datatrove's ``xxhash64`` as it ran on xxhash 3: a ``str`` hashed as its UTF-8 bytes."""
    return xxh64_intdigest(data.encode() if isinstance(data, str) else data)


PIPELINES = {"ours": "ours", "datatrove_spacy": "spacy", "datatrove_ws": "whitespace"}
"""Each variant's name → its word tokenizer (datatrove: its English default, spaCy, or whitespace)."""
LIKE_FOR_LIKE, SPACY = "datatrove_ws", "datatrove_spacy"
HEADLINE = "ours_vs_datatrove_like_for_like_per_core"
AGREEMENT_FLOOR = 0.99
"""Below this like-for-like agreement, a class's first disagreeing documents are printed."""


def _step(stats, index: int, key: str, field: str = "total") -> int:
    """One counter of pipeline step ``index`` in an executor's merged stats (0 if never counted)."""
    value = stats.stats[index].to_dict()["stats"].get(key, 0)
    return int(value.get(field, 0) if isinstance(value, dict) else value)


def _lines(folder: Path) -> int:
    return sum(sum(1 for _ in open(path, "rb")) for path in folder.glob("*.jsonl")) if folder.is_dir() else 0


def child_datatrove(corpus: str, out: str, workers: int, tokenizer: str, words: str) -> dict:
    # Imported by its module name so that datatrove's worker processes unpickle it from there.
    import datatrove.utils.hashes.xxhash as datatrove_xxhash
    from bench_dataprep import WhitespaceWords, utf8_xxhash32, utf8_xxhash64
    from datatrove.executor import LocalPipelineExecutor
    from datatrove.pipeline.dedup import MinhashDedupBuckets, MinhashDedupCluster, MinhashDedupFilter, MinhashDedupSignature
    from datatrove.pipeline.dedup.minhash import MinhashConfig
    from datatrove.pipeline.filters import GopherQualityFilter, GopherRepetitionFilter
    from datatrove.pipeline.readers import JsonlReader
    from datatrove.pipeline.tokens import DocumentTokenizer
    from datatrove.pipeline.writers import JsonlWriter
    from datatrove.utils.hashing import HashConfig

    # Datatrove's default hashing (xxhash, 64 bits), on xxhash 4, which refuses the str it passes.
    datatrove_xxhash.xxhash32, datatrove_xxhash.xxhash64 = utf8_xxhash32, utf8_xxhash64
    language = WhitespaceWords() if words == "whitespace" else "en"
    base = Path(out)
    files = len(list(Path(corpus).glob("*.jsonl")))
    minhash = MinhashConfig(num_buckets=BANDS, hashes_per_bucket=ROWS, n_grams=SHINGLE_WORDS)
    require(minhash.hash_config == HashConfig(), f"datatrove's MinHash hashing is not its default: {minhash.hash_config}")

    def excluded(name: str) -> JsonlWriter:
        return JsonlWriter(str(base / "excluded" / name), compression=None)

    def stage(name: str, pipeline: list, tasks: int) -> LocalPipelineExecutor:
        return LocalPipelineExecutor(pipeline, tasks=tasks, workers=workers, logging_dir=str(base / "logs" / name))

    filtered = str(base / "filtered")
    # The dedup filter pairs its reader's rank r with signature file r, but a rank whose documents the
    # filters all drop writes no filtered file, which would pair every later rank with the wrong
    # signatures (the spaCy run of a small corpus does it). Every rank's file is created empty first.
    Path(filtered).mkdir(parents=True)
    for rank in range(files):
        (Path(filtered) / f"{rank:05d}.jsonl").touch()
    signature = MinhashDedupSignature(output_folder=str(base / "signatures"), config=minhash, language=language)
    require(signature._hash_func is utf8_xxhash64, "datatrove's MinHash does not hash with its default xxhash64")
    signatures = stage(
        "signatures",
        [
            JsonlReader(corpus, text_key="text", id_key="id"),
            GopherRepetitionFilter(exclusion_writer=excluded("gopher_repetition"), language=language),
            GopherQualityFilter(exclusion_writer=excluded("gopher_quality"), language=language),
            JsonlWriter(filtered, output_filename="${rank}.jsonl", compression=None),
            signature,
        ],
        files,
    )
    buckets = stage(
        "buckets",
        [MinhashDedupBuckets(input_folder=str(base / "signatures"), output_folder=str(base / "buckets"), config=minhash)],
        BANDS,
    )
    clusters = stage(
        "clusters",
        [MinhashDedupCluster(input_folder=str(base / "buckets"), output_folder=str(base / "remove"), config=minhash)],
        1,
    )
    tokens = stage(
        "tokens",
        [
            JsonlReader(filtered, text_key="text", id_key="id"),
            MinhashDedupFilter(input_folder=str(base / "remove"), exclusion_writer=excluded("near_duplicate")),
            DocumentTokenizer(output_folder=str(base / "tokens"), tokenizer_name_or_path=tokenizer, eos_token="<|endoftext|>"),
        ],
        files,
    )
    # Stage by stage, as ``depends=`` would run them, each timed.
    stages = {"filters_signatures": signatures, "buckets": buckets, "clusters": clusters, "dedup_tokenize": tokens}
    timings, merged = {}, {}
    start = time.perf_counter()
    for name, executor in stages.items():
        began = time.perf_counter()
        merged[name] = executor.run()
        timings[name] = time.perf_counter() - began
    seconds = time.perf_counter() - start
    # Untimed from here: what the run did, for the parent's checks.
    require(all(v is not None for v in merged.values()), "a datatrove stage ran no task (its logs said it was done)")
    written = sorted(p.name for p in Path(filtered).glob("*.jsonl"))
    require(
        written == [f"{rank:05d}.jsonl" for rank in range(files)], f"datatrove's filtered files are not one a rank: {written}"
    )
    first, last = merged["filters_signatures"], merged["dedup_tokenize"]
    dropped = {
        "gopher_repetition": _step(first, 1, "dropped"),
        "gopher_quality": _step(first, 2, "dropped"),
        "near_duplicate": _step(last, 1, "dropped"),
    }
    return {
        "seconds": seconds,
        "stages": timings,
        "minhash": str(minhash),
        "documents_read": _step(first, 0, "documents"),
        "documents_filtered": _step(first, 3, "total"),
        "documents_filtered_read": _step(last, 0, "documents"),
        "dropped": dropped,
        "excluded": {name: _lines(base / "excluded" / name) for name in dropped},
        "documents_kept": _step(last, 2, "tokens", "n"),
        "tokens": _step(last, 2, "tokens"),
        "token_bytes": sum(p.stat().st_size for p in (base / "tokens").rglob("*.ds")),
    }


# --- processes ------------------------------------------------------------------------------
def run_child(args: list[str], log: Path) -> tuple[dict, float]:
    """This script in ``--child`` mode; its JSON and the process's wall seconds (imports included)."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])))
    start = time.perf_counter()
    with open(log, "a") as err:
        proc = subprocess.run(
            [sys.executable, __file__, "--child", *args], stdout=subprocess.PIPE, stderr=err, env=env, text=True
        )
    wall = time.perf_counter() - start
    if proc.returncode:
        tail = log.read_text(errors="replace")[-4000:]  # the log goes with the temporary folder
        raise BenchmarkCheckError(f"{tail}\nchild {args[0]} failed with exit code {proc.returncode}: no ratio is reported")
    lines = proc.stdout.strip().splitlines()
    require(lines, f"child {args[0]} exited 0 without its result: no ratio is reported")
    return json.loads(lines[-1]), wall


def checked_run(name: str, result: dict, out: Path, documents: int) -> dict:
    """What a run did (documents read and kept, tokens), after the checks that stand behind its
    timing: it read the whole corpus and produced a dataset; datatrove's exclusion writers hold
    every document its steps dropped."""
    if name == "ours":
        stats = result["stats"]
        read, kept, tokens = stats["documents_read"], stats["documents_kept"], stats["train_tokens"] + stats["val_tokens"]
        datasets = list((out / "datasets").glob("*/_COMMITTED"))
        require(len(datasets) == 1, f"{name}: {len(datasets)} committed datasets under {out}, expected 1")
        shards = sum(p.stat().st_size for p in (datasets[0].parent / "shards").rglob("*") if p.is_file())
        require(shards > 0, f"{name}: the dataset has no shard bytes")
    else:
        read, kept, tokens = result["documents_read"], result["documents_kept"], result["tokens"]
        dropped = result["dropped"]
        require(
            result["excluded"] == dropped,
            f"{name}: the exclusion writers hold {result['excluded']} documents, the steps dropped {dropped}",
        )
        require(
            read == dropped["gopher_repetition"] + dropped["gopher_quality"] + result["documents_filtered"]
            and result["documents_filtered_read"] == result["documents_filtered"]
            and result["documents_filtered"] == dropped["near_duplicate"] + kept,
            f"{name}: documents lost between its steps: {result}",
        )
        require(result["token_bytes"] > 0, f"{name}: no token files written")
    require(read == documents, f"{name} read {read} documents, the corpus has {documents}")
    require(kept > 0 and tokens > 0, f"{name} kept {kept} documents and wrote {tokens} tokens: no output")
    return {"documents_read": read, "documents_kept": kept, "tokens": tokens}


# --- agreement ------------------------------------------------------------------------------
def _excluded_ids(folder: Path) -> dict[str, str]:
    """Document id → datatrove's filter reason, from an exclusion writer's output."""
    out: dict[str, str] = {}
    for path in sorted(folder.glob("*.jsonl*")) if folder.is_dir() else []:
        opener = gzip.open if path.suffix == ".gz" else open
        with opener(path, "rt", encoding="utf-8") as f:
            for line in f:
                record = json.loads(line)
                out[record["id"]] = (record.get("metadata") or {}).get("filter_reason", "")
    return out


def _ours_verdicts(corpus: Path, meta: dict, dataset: Path, workers: int) -> dict[str, str]:
    """Document id → our reason (``""`` kept): the filters' own function on every document, and
    the dataset's kept documents for the dedup verdicts."""
    from data_prep.filters import filtered_text

    config = ours_config(str(corpus), workers)
    with open(dataset / "doc_stats.csv") as f:
        kept = {row["source"] for row in csv.DictReader(f)}
    verdicts: dict[str, str] = {}
    for index, ids in enumerate(meta["files"]):
        name = f"part-{index:05d}.jsonl"
        with open(corpus / name, encoding="utf-8") as f:
            for lineno, line in enumerate(f, start=1):
                doc_id = ids[lineno - 1]
                _, reason, _ = filtered_text(json.loads(line)["text"], config)
                if not reason and f"{name}:{lineno}" not in kept:
                    reason = "duplicate"  # exact or near: both are what datatrove's MinHash stages catch
                verdicts[doc_id] = reason
    return verdicts


def _our_class(reason: str) -> str:
    if reason.startswith("quality_rep_"):
        return "gopher_repetition"
    if reason.startswith("quality_gopher_"):
        return "gopher_quality"
    if reason == "duplicate":
        return "near_duplicate"
    return "other" if reason else ""


def _their_verdicts(base: Path, documents: set[str]) -> dict[str, dict[str, str]]:
    """Rule class → {document id → datatrove's reason} from a run's exclusion writers."""
    theirs = {name: _excluded_ids(base / "excluded" / name) for name in CLASSES}
    for name, ids in theirs.items():
        unknown = sorted(set(ids) - documents)
        require(not unknown, f"{base.name}: {name} excluded documents not in the corpus: {unknown[:5]}")
    seen = Counter(d for ids in theirs.values() for d in ids)
    twice = sorted(d for d, n in seen.items() if n > 1)
    require(not twice, f"{base.name}: documents excluded by two steps: {twice[:5]}")
    return theirs


def _row(docs: list[str], ours_drop: set[str], their_drop: set[str], ours: dict, theirs: dict, kinds: dict) -> dict:
    """Keep/drop counts of ``docs`` on both sides, and the first disagreements."""
    differ = ours_drop ^ their_drop
    prose = sum(kinds[d] == "prose" for d in docs)
    return {
        "documents": len(docs),
        "agreement": 1 - len(differ) / len(docs) if docs else 1.0,
        "agreement_prose": 1 - sum(kinds[d] == "prose" for d in differ) / prose if prose else 1.0,
        "kept_both": len(docs) - len(ours_drop | their_drop),
        "dropped_both": len(ours_drop & their_drop),
        "dropped_ours_only": len(ours_drop - their_drop),
        "dropped_datatrove_only": len(their_drop - ours_drop),
        "ours_only_rules": dict(Counter(ours[d] for d in ours_drop - their_drop).most_common(6)),
        "datatrove_only_rules": dict(Counter(theirs[d] for d in their_drop - ours_drop).most_common(6)),
        # [id, kind, our verdict, datatrove's]: up to 3 dropped by our side only, 3 by datatrove's only, prose first.
        "examples": [
            [d, kinds[d], ours[d] or "kept", theirs.get(d, "kept")]
            for side in (ours_drop - their_drop, their_drop - ours_drop)
            for d in sorted(side, key=lambda d: (kinds[d] != "prose", d))[:3]
        ],
    }


def agreement(ours: dict[str, str], theirs: dict[str, dict[str, str]], kinds: dict[str, str]) -> dict:
    """Document by document: per class, among the documents both sides submitted to it, and
    ``overall`` (kept or not, whatever the reason), the keep/drop counts of both sides."""
    result: dict = {}
    for at, name in enumerate(CLASSES):
        earlier = CLASSES[:at]
        both = [d for d in ours if _our_class(ours[d]) not in ("other", *earlier) and not any(d in theirs[e] for e in earlier)]
        reasons = {d: r or name for d, r in theirs[name].items()}
        ours_drop = {d for d in both if _our_class(ours[d]) == name}
        result[name] = _row(both, ours_drop, {d for d in both if d in reasons}, ours, reasons, kinds)
    reasons = {d: f"{name}: {r}" if r else name for name in CLASSES for d, r in theirs[name].items()}
    result["overall"] = _row(list(ours), {d for d, r in ours.items() if r}, set(reasons), ours, reasons, kinds)
    return result


# --- the benchmark ----------------------------------------------------------------------------
def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    # 40 MB: datatrove with spaCy runs at ~0.1–0.3 MB/s per core here, 1–2 minutes a repeat.
    parser.add_argument("--mb", type=float, default=40, help="corpus size in MB")
    parser.add_argument("--prose-share", type=float, default=PROSE_SHARE, help="least share of the corpus' bytes that is prose")
    parser.add_argument("--repeats", type=int, default=3, help="timed runs of each variant, in a rotated order")
    parser.add_argument("--workers", type=int, default=2, help="worker processes of both pipelines (data.workers)")
    parser.add_argument("--quick", action="store_true", help="a 6 MB corpus, one repeat: a smoke run")
    parser.add_argument("--tmp", default=None, help="where to write corpora and outputs (default: system temp)")
    args = parser.parse_args()
    if args.quick:
        args.mb, args.repeats = 6, 1
    require(args.repeats >= 1, "--repeats must be at least 1")

    import datatrove  # noqa: F401  (fail before building anything when the bench extra is missing)

    started, load_start = time.perf_counter(), os.getloadavg()[0]
    names = list(PIPELINES)
    with tempfile.TemporaryDirectory(prefix="bench-dataprep-", dir=args.tmp) as tmp:
        work = Path(tmp)
        corpus = work / "corpus"
        meta = build_corpus(corpus, int(args.mb * 1e6), prose_share=args.prose_share)
        mb = meta["bytes"] / 1e6
        prose_share = meta["prose_bytes"] / meta["text_bytes"]
        # Not an assert (python -O): a corpus that is not the prose share it claims gets no figure.
        require(
            prose_share >= args.prose_share,
            f"the corpus is {prose_share:.3f} prose ({meta['prose_bytes'] / 1e6:.1f} of {meta['text_bytes'] / 1e6:.1f} MB "
            f"of text), not the {args.prose_share} it claims: this machine's prose ran out, or the planted copies are code",
        )
        print(
            f"corpus: {mb:.1f} MB in {len(meta['files'])} files, {meta['documents']} documents "
            f"({meta['prose_documents']} prose, {prose_share:.1%} of the text; {meta['planted']} planted near-duplicates)",
            flush=True,
        )
        log = work / "children.log"
        # Warm-up, untimed: ours once, which trains the tokenizer datatrove's DocumentTokenizer loads.
        warmup = work / "warmup"
        result, wall = run_child(["ours", str(corpus), str(warmup), str(args.workers)], log)
        warm = checked_run("ours", result, warmup, meta["documents"])
        tokenizer = work / "tokenizer.json"
        shutil.copy(next((warmup / "datasets").iterdir()) / "tokenizer.json", tokenizer)
        shutil.rmtree(warmup)
        print(f"  warm-up ours (untimed) {result['seconds']:.1f} s: tokenizer trained", flush=True)

        runs: dict[str, list[dict]] = {name: [] for name in names}
        orders = []
        minhash = ""
        for repeat in range(args.repeats):
            order = names[repeat % len(names) :] + names[: repeat % len(names)]
            orders.append(order)
            for position, name in enumerate(order):
                out = work / f"{name}-{repeat}"
                if name == "ours":
                    child_args = ["ours", str(corpus), str(out), str(args.workers)]
                else:
                    child_args = ["datatrove", str(corpus), str(out), str(args.workers), str(tokenizer), PIPELINES[name]]
                result, wall = run_child(child_args, log)
                counts = checked_run(name, result, out, meta["documents"])
                minhash = result.get("minhash", minhash)
                run = {"repeat": repeat, "position": position, "seconds": result["seconds"], "process_seconds": wall}
                run |= counts
                if "stages" in result:
                    run["stages"] = result["stages"]
                run["mb_s_per_core"] = mb / result["seconds"] / args.workers
                runs[name].append(run)
                print(
                    f"  repeat {repeat}.{position} {name:<15} {result['seconds']:7.1f} s  "
                    f"{run['mb_s_per_core']:6.3f} MB/s per core, kept {counts['documents_kept']}  "
                    f"(process with imports {wall:.1f} s)"
                    + (
                        "; stages " + ", ".join(f"{k} {v:.1f} s" for k, v in result["stages"].items())
                        if "stages" in result
                        else ""
                    ),
                    flush=True,
                )
                if name == "ours" and repeat == 0:
                    stats, dataset = result["stats"], next((out / "datasets").iterdir())
                # Keep only the first repeat's outputs: the agreement reads them.
                if repeat and out.exists():
                    shutil.rmtree(out)
        # The same pipeline on the same corpus keeps the same documents in every run.
        for name, values in runs.items():
            kept = {r["documents_kept"] for r in values} | ({warm["documents_kept"]} if name == "ours" else set())
            require(len(kept) == 1, f"{name} kept a different number of documents across its runs: {sorted(kept)}")
        ours = _ours_verdicts(corpus, meta, dataset, args.workers)
        # Our verdicts must be the prepare step's: its counters, rule by rule, and its kept documents.
        counted = {k.removeprefix("skipped_"): v for k, v in stats.items() if k.startswith("skipped_quality_") and v}
        recomputed = dict(Counter(r for r in ours.values() if r.startswith("quality_")))
        require(
            counted == recomputed, f"our quality verdicts differ: prepare counted {counted}, filtered_text gives {recomputed}"
        )
        kept_ours = sum(1 for r in ours.values() if not r)
        require(kept_ours == stats["documents_kept"], f"our verdicts keep {kept_ours}, prepare kept {stats['documents_kept']}")
        ids = set(meta["kinds"])
        agree = {
            name: agreement(ours, _their_verdicts(work / f"{name}-0", ids), meta["kinds"]) for name in (LIKE_FOR_LIKE, SPACY)
        }
        for name in (LIKE_FOR_LIKE, SPACY):
            kept_theirs = agree[name]["overall"]["kept_both"] + agree[name]["overall"]["dropped_ours_only"]
            require(
                kept_theirs == runs[name][0]["documents_kept"],
                f"{name}: its exclusion writers leave {kept_theirs} documents, it tokenized {runs[name][0]['documents_kept']}",
            )

    figures = {name: [r["mb_s_per_core"] for r in runs[name]] for name in runs}
    # Each repeat's ratio pairs the runs of that repeat.
    per_repeat = {
        HEADLINE: [o / d for o, d in zip(figures["ours"], figures[LIKE_FOR_LIKE], strict=True)],
        "ours_vs_datatrove_spacy_per_core": [o / d for o, d in zip(figures["ours"], figures[SPACY], strict=True)],
    }
    summary = ratio_keys(per_repeat)
    for name, values in figures.items():
        print(f"{name:>15}: {statistics.median(values):.3f} MB/s per core (min {min(values):.3f}, max {max(values):.3f})")
    for key, values in per_repeat.items():
        print(
            f"{key}: {summary['ratios'][key]:.2f}× [{min(values):.2f}, {max(values):.2f}]"
            + (" (headline)" if key == HEADLINE else "")
        )
    for name, label in ((LIKE_FOR_LIKE, "like for like, whitespace words"), (SPACY, "datatrove with spaCy words")):
        print(f"agreement with {name} ({label}):")
        for cls, row in agree[name].items():
            print(
                f"  {cls:<18} {row['agreement']:.4f} (prose {row['agreement_prose']:.4f}) on {row['documents']} documents: "
                f"kept by both {row['kept_both']}, dropped by both {row['dropped_both']}, "
                f"ours only {row['dropped_ours_only']} {row['ours_only_rules']}, "
                f"datatrove only {row['dropped_datatrove_only']} {row['datatrove_only_rules']}"
            )
            if name == LIKE_FOR_LIKE and row["agreement"] < AGREEMENT_FLOOR:
                print(f"    below {AGREEMENT_FLOOR}; first disagreements [id, kind, ours, datatrove]:")
                for example in row["examples"]:
                    print(f"      {example}")
    result = {
        "benchmark": "dataprep",
        "corpus": {
            "mb": round(mb, 2),
            "text_mb": round(meta["text_bytes"] / 1e6, 2),
            "documents": meta["documents"],
            "prose_documents": meta["prose_documents"],
            "prose_mb": round(meta["prose_bytes"] / 1e6, 2),
            "code_mb": round(meta["code_bytes"] / 1e6, 2),
            "prose_share": round(prose_share, 3),
            "prose_share_claimed": args.prose_share,
            "planted_near_duplicates": meta["planted"],
            "files": len(meta["files"]),
        },
        "workers": args.workers,
        "repeats": args.repeats,
        # Ours' data.quality beyond the defaults; datatrove runs GopherRepetitionFilter() and GopherQualityFilter().
        "quality": QUALITY,
        "order": orders,
        "datatrove_minhash": minhash,
        "mb_s_per_core": {name: statistics.median(values) for name, values in figures.items()},
        "mb_s_per_core_range": {name: [min(values), max(values)] for name, values in figures.items()},
        "runs": runs,
        "kept": {name: values[0]["documents_kept"] for name, values in runs.items()},
        "headline": HEADLINE,
        **summary,
        "ratios_per_repeat": per_repeat,
        # Like for like (datatrove_ws): the share of documents decided alike, per class and overall.
        "agreement": {cls: row["agreement"] for cls, row in agree[LIKE_FOR_LIKE].items()},
        "agreement_detail": agree[LIKE_FOR_LIKE],
        "agreement_spacy": {cls: row["agreement"] for cls, row in agree[SPACY].items()},
        "agreement_spacy_detail": agree[SPACY],
        "machine": machine(["datatrove", "spacy", "tokenizers", "xxhash"]),
        "seconds": time.perf_counter() - started,
        # How busy the machine was (1-minute load average): other jobs slow every run.
        "load_average_start": round(load_start, 2),
        "load_average_end": round(os.getloadavg()[0], 2),
    }
    print(json.dumps(result))


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--child":
        sys.path.insert(0, str(ROOT))
        sys.path.insert(0, str(ROOT / "benchmarks"))
        mode, *rest = sys.argv[2:]
        if mode == "ours":
            out = child_ours(rest[0], rest[1], int(rest[2]))
        else:
            out = child_datatrove(rest[0], rest[1], int(rest[2]), rest[3], rest[4])
        print(json.dumps(out))
    else:
        main()
