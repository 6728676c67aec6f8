"""Our prepare step against datatrove 0.10.1 on the same corpus: MB/s per core and keep/drop agreement.

    python benchmarks/bench_dataprep.py [--mb 40] [--repeats 3] [--workers 2] [--quick]

Needs the ``bench`` extra (``pip install -c requirements.lock -e ".[bench]"``: datatrove, and
spaCy, the word tokenizer datatrove uses for English).

Corpus (deterministic, from this machine's files): Python source (the standard library, then
site-packages ``.py`` files to reach the size), English prose (``.md``/``.rst``/``.txt`` under
site-packages and plain-text files under /usr/share/doc) and planted near-duplicates (edited
copies of 4% of the documents, placed later in the corpus), shuffled with a fixed seed into
4 MB JSONL files with ``id`` and ``text`` fields. Both pipelines read the same files.

* **ours**: ``data_prep.prepare.prepare_dataset`` end to end on a local store: read, clean
  (NFC), PII redaction (defaults), Gopher repetition and quality rules at datatrove's default
  thresholds, exact and verified MinHash near-dup dedup (5-word shingles, 16 bands × 8 rows),
  BPE training, tokenization, packing, WebDataset shards, manifest; ``data.workers`` processes.
* **datatrove**: ``LocalPipelineExecutor`` stages, the same number of worker processes:
  JsonlReader → GopherRepetitionFilter → GopherQualityFilter (defaults, exclusion writers) →
  JsonlWriter + MinhashDedupSignature (5-grams, 16 buckets × 8 hashes, 64-bit sha1) →
  MinhashDedupBuckets → MinhashDedupCluster → JsonlReader → MinhashDedupFilter (exclusion
  writer) → DocumentTokenizer with the tokenizer.json our run trained (HF tokenizers); words
  are spaCy's English tokens (datatrove's default for English);
* **datatrove_ws**: the same pipeline with a whitespace word tokenizer (``WhitespaceWords``,
  our words): what is left of the disagreement is the rules', and the speed without spaCy.

Repeats alternate the three, each in a fresh process (ours first: datatrove needs its
tokenizer). Throughput is corpus file bytes / wall seconds / worker processes. Agreement per
rule class: among the documents both pipelines submitted to that class, the share on which
both made the same keep/drop decision (datatrove: its exclusion writers; ours: ``filtered_text``
with the same config, checked against the manifest's counters, and the kept documents of
``doc_stats.csv`` for the dedup). Last line: one JSON object.
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

from machine_info import machine, require  # benchmarks/ (the script's folder)

ROOT = Path(__file__).resolve().parents[1]
FILE_BYTES = 4 << 20
MIN_CHARS, MAX_CHARS = 200, 400_000  # documents outside are not picked (no length filter decides anything)
PLANTED_SHARE = 0.04
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


def build_corpus(root: Path, total_bytes: int, seed: int = 0) -> dict:
    """JSONL files of ``{"id", "text"}`` records; returns what the agreement needs to know."""
    rng = random.Random(seed)
    groups = _candidates()
    docs: list[tuple[str, str, str]] = []  # id, kind, text
    size = 0
    # Prose first (at most half the corpus), then code up to the size: prose is what the Gopher rules are for.
    for kind, share in (("prose", 0.5), ("code", 1.0)):
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
    return {
        "files": files,
        "kinds": kinds,
        "documents": len(order),
        "planted": len(planted),
        "prose_documents": sum(k == "prose" for k in kinds.values()),
        "bytes": sum(p.stat().st_size for p in root.iterdir()),
        "text_bytes": sum(len(t.encode()) for _, _, t in order),
    }


def _write(root: Path, index: int, lines: list[str]) -> list[str]:
    (root / f"part-{index:05d}.jsonl").write_text("\n".join(lines) + "\n", encoding="utf-8")
    return [json.loads(line)["id"] for line in lines]


# --- ours ---------------------------------------------------------------------------------
def ours_config(corpus: str, workers: int):
    from data_prep.config import DataConfig, GopherConfig, QualityConfig, RepetitionConfig

    quality = QualityConfig(gopher=GopherConfig(enabled=True), repetition=RepetitionConfig(enabled=True, **GOPHER_REPETITION))
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


PIPELINES = {"ours": "ours", "datatrove": "spacy", "datatrove_ws": "whitespace"}
"""Each run's name → its word tokenizer (datatrove: its English default, spaCy, or whitespace)."""


def child_datatrove(corpus: str, out: str, workers: int, tokenizer: str, words: str) -> dict:
    # Imported by its module name so that datatrove's worker processes unpickle it from there.
    from bench_dataprep import WhitespaceWords
    from datatrove.executor import LocalPipelineExecutor
    from datatrove.pipeline.dedup import MinhashDedupBuckets, MinhashDedupCluster, MinhashDedupFilter, MinhashDedupSignature
    from datatrove.pipeline.dedup.minhash import MinhashConfig
    from datatrove.pipeline.filters import GopherQualityFilter, GopherRepetitionFilter
    from datatrove.pipeline.readers import JsonlReader
    from datatrove.pipeline.tokens import DocumentTokenizer
    from datatrove.pipeline.writers import JsonlWriter
    from datatrove.utils.hashing import HashConfig

    language = WhitespaceWords() if words == "whitespace" else "en"
    base = Path(out)
    files = len(list(Path(corpus).glob("*.jsonl")))
    # sha1, not datatrove's default xxhash: its xxhash path passes str, which xxhash 4 (our lock's) refuses.
    hashing = HashConfig(precision=64, hash_fc="sha1")
    minhash = MinhashConfig(hash_config=hashing, num_buckets=BANDS, hashes_per_bucket=ROWS, n_grams=SHINGLE_WORDS)

    def excluded(name: str) -> JsonlWriter:
        return JsonlWriter(str(base / "excluded" / name), compression=None)

    def stage(name: str, pipeline: list, tasks: int) -> LocalPipelineExecutor:
        return LocalPipelineExecutor(pipeline, tasks=tasks, workers=workers, logging_dir=str(base / "logs" / name))

    filtered = str(base / "filtered")
    signatures = stage(
        "signatures",
        [
            JsonlReader(corpus, text_key="text", id_key="id"),
            GopherRepetitionFilter(exclusion_writer=excluded("gopher_repetition"), language=language),
            GopherQualityFilter(exclusion_writer=excluded("gopher_quality"), language=language),
            JsonlWriter(filtered, output_filename="${rank}.jsonl", compression=None),
            MinhashDedupSignature(output_folder=str(base / "signatures"), config=minhash, language=language),
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
    timings = {}
    start = time.perf_counter()
    for name, executor in stages.items():
        began = time.perf_counter()
        executor.run()
        timings[name] = time.perf_counter() - began
    # The dedup filter pairs its reader's rank r with signature file r: a rank whose documents
    # were all dropped writes no filtered file and would shift the others. Checked after the run.
    seconds = time.perf_counter() - start
    written = len(list(Path(filtered).glob("*.jsonl")))
    if written != files:
        raise SystemExit(
            f"datatrove: {files - written} of {files} input files lost every document to the filters: use a larger corpus"
        )
    return {"seconds": seconds, "stages": timings}


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
        raise SystemExit(f"{tail}\nchild {args[0]} failed with exit code {proc.returncode}")
    return json.loads(proc.stdout.strip().splitlines()[-1]), wall


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


def agreement(ours: dict[str, str], theirs: dict[str, dict[str, str]], kinds: dict[str, str]) -> dict:
    """Per class: share of the documents both sides submitted to it on which they agree, the
    counts of one-sided drops, and a few examples of each (id, our reason, datatrove's)."""
    result: dict = {}
    stages = list(CLASSES)
    for at, name in enumerate(stages):
        earlier = stages[:at]
        both = [d for d in ours if _our_class(ours[d]) not in ("other", *earlier) and not any(d in theirs[e] for e in earlier)]
        ours_drop = {d for d in both if _our_class(ours[d]) == name}
        their_drop = {d for d in both if d in theirs[name]}
        differ = sorted(ours_drop ^ their_drop)
        prose = [d for d in both if kinds[d] == "prose"]
        result[name] = {
            "documents": len(both),
            "agreement": 1 - len(differ) / len(both) if both else 1.0,
            "agreement_prose": 1 - sum(kinds[d] == "prose" for d in differ) / len(prose) if prose else 1.0,
            "dropped_both": len(ours_drop & their_drop),
            "dropped_ours_only": len(ours_drop - their_drop),
            "dropped_datatrove_only": len(their_drop - ours_drop),
            "ours_only_rules": dict(Counter(ours[d] for d in ours_drop - their_drop).most_common(6)),
            "datatrove_only_rules": dict(Counter(theirs[name][d] or name for d in their_drop - ours_drop).most_common(6)),
            "examples": [
                [d, kinds[d], ours[d] or "kept", theirs[name].get(d, "kept") or name]
                for d in _examples(ours_drop, their_drop, kinds)
            ],
        }
    return result


def _examples(ours_drop: set[str], their_drop: set[str], kinds: dict[str, str]) -> list[str]:
    """Up to 3 documents dropped by our side only and 3 by datatrove's only, prose first."""
    out = []
    for side in (ours_drop - their_drop, their_drop - ours_drop):
        out += sorted(side, key=lambda d: (kinds[d] != "prose", d))[:3]
    return out


# --- the benchmark ----------------------------------------------------------------------------
def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    # 40 MB: datatrove with spaCy runs at ~0.1–0.2 MB/s per core here, 2–3 minutes a repeat.
    parser.add_argument("--mb", type=float, default=40, help="corpus size in MB")
    parser.add_argument("--repeats", type=int, default=3, help="runs of each pipeline, alternating")
    parser.add_argument("--workers", type=int, default=2, help="worker processes of both pipelines (data.workers)")
    parser.add_argument("--quick", action="store_true", help="a 6 MB corpus, one repeat: a smoke run")
    parser.add_argument("--tmp", default=None, help="where to write corpora and outputs (default: system temp)")
    args = parser.parse_args()
    if args.quick:
        args.mb, args.repeats = 6, 1

    import datatrove  # noqa: F401  (fail before building anything when the bench extra is missing)

    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="bench-dataprep-", dir=args.tmp) as tmp:
        work = Path(tmp)
        corpus = work / "corpus"
        meta = build_corpus(corpus, int(args.mb * 1e6))
        mb = meta["bytes"] / 1e6
        print(
            f"corpus: {mb:.1f} MB in {len(meta['files'])} files, {meta['documents']} documents "
            f"({meta['prose_documents']} prose, {meta['planted']} planted near-duplicates)",
            flush=True,
        )
        log = work / "children.log"
        runs: dict[str, list[dict]] = {name: [] for name in PIPELINES}
        tokenizer = work / "tokenizer.json"
        dataset = None
        for repeat in range(args.repeats):
            for name, words in PIPELINES.items():
                out = work / f"{name}-{repeat}"
                if name == "ours":
                    child_args = ["ours", str(corpus), str(out), str(args.workers)]
                else:
                    child_args = ["datatrove", str(corpus), str(out), str(args.workers), str(tokenizer), words]
                result, wall = run_child(child_args, log)
                run = {"repeat": repeat, "seconds": result["seconds"], "process_seconds": wall}
                if "stages" in result:
                    run["stages"] = result["stages"]
                run["mb_s_per_core"] = mb / result["seconds"] / args.workers
                runs[name].append(run)
                print(
                    f"  repeat {repeat} {name:<12} {result['seconds']:7.1f} s  {run['mb_s_per_core']:6.3f} MB/s per core  "
                    f"(process with imports {wall:.1f} s)"
                    + (
                        "; stages " + ", ".join(f"{k} {v:.1f} s" for k, v in result["stages"].items())
                        if "stages" in result
                        else ""
                    ),
                    flush=True,
                )
                if name == "ours" and dataset is None:
                    stats, dataset = result["stats"], next((out / "datasets").iterdir())
                    shutil.copy(dataset / "tokenizer.json", tokenizer)
                # Keep only the first repeat's outputs: the agreement reads them.
                if repeat and out.exists():
                    shutil.rmtree(out)
        require(dataset is not None, "our prepare run left no dataset: there is nothing to compare")
        ours = _ours_verdicts(corpus, meta, dataset, args.workers)
        # Our verdicts must be the prepare step's: its counters, rule by rule.
        counted = {k.removeprefix("skipped_"): v for k, v in stats.items() if k.startswith("skipped_quality_") and v}
        recomputed = dict(Counter(r for r in ours.values() if r.startswith("quality_")))
        require(
            counted == recomputed, f"our quality verdicts differ: prepare counted {counted}, filtered_text gives {recomputed}"
        )
        theirs = {name: _excluded_ids(work / "datatrove-0" / "excluded" / name) for name in CLASSES}
        agree = agreement(ours, theirs, meta["kinds"])
        theirs_ws = {name: _excluded_ids(work / "datatrove_ws-0" / "excluded" / name) for name in CLASSES}
        agree_ws = agreement(ours, theirs_ws, meta["kinds"])
        kept_ours = sum(1 for r in ours.values() if not r)
        kept_theirs = meta["documents"] - sum(len(v) for v in theirs.values())
        kept_ws = meta["documents"] - sum(len(v) for v in theirs_ws.values())

    figures = {name: [r["mb_s_per_core"] for r in runs[name]] for name in runs}
    ratios = [o / d for o, d in zip(figures["ours"], figures["datatrove"], strict=True)]
    ratios_ws = [o / d for o, d in zip(figures["ours"], figures["datatrove_ws"], strict=True)]
    for name, values in figures.items():
        print(f"{name:>9}: {statistics.median(values):.3f} MB/s per core (min {min(values):.3f}, max {max(values):.3f})")
    print(f"ours vs datatrove per core: {statistics.median(ratios):.2f}× [{min(ratios):.2f}, {max(ratios):.2f}] (goal ≥ 1.5)")
    print(
        f"ours vs datatrove with whitespace words per core: {statistics.median(ratios_ws):.2f}× "
        f"[{min(ratios_ws):.2f}, {max(ratios_ws):.2f}]"
    )
    for name, row in [*agree.items(), *((f"{k} (whitespace words)", v) for k, v in agree_ws.items())]:
        print(
            f"  agreement {name:<18} {row['agreement']:.4f} (prose {row['agreement_prose']:.4f}) "
            f"on {row['documents']} documents; "
            f"dropped by both {row['dropped_both']}, ours only {row['dropped_ours_only']} {row['ours_only_rules']}, "
            f"datatrove only {row['dropped_datatrove_only']} {row['datatrove_only_rules']}"
        )
        for example in row["examples"]:
            print(f"      {example}")
    result = {
        "benchmark": "dataprep",
        "corpus": {
            "mb": round(mb, 2),
            "text_mb": round(meta["text_bytes"] / 1e6, 2),
            "documents": meta["documents"],
            "prose_documents": meta["prose_documents"],
            "planted_near_duplicates": meta["planted"],
            "files": len(meta["files"]),
        },
        "workers": args.workers,
        "repeats": args.repeats,
        "mb_s_per_core": {name: statistics.median(values) for name, values in figures.items()},
        "mb_s_per_core_range": {name: [min(values), max(values)] for name, values in figures.items()},
        "runs": runs,
        "kept": {"ours": kept_ours, "datatrove": kept_theirs, "datatrove_ws": kept_ws},
        "ratios": {
            "ours_vs_datatrove_per_core": statistics.median(ratios),
            "ours_vs_datatrove_whitespace_words_per_core": statistics.median(ratios_ws),
        },
        "spread": {
            "ours_vs_datatrove_per_core": [min(ratios), max(ratios)],
            "ours_vs_datatrove_whitespace_words_per_core": [min(ratios_ws), max(ratios_ws)],
        },
        "agreement": {name: row["agreement"] for name, row in agree.items()},
        "agreement_detail": agree,
        # Datatrove's pipeline with whitespace words (as ours) instead of spaCy's tokens.
        "agreement_whitespace_words": {name: row["agreement"] for name, row in agree_ws.items()},
        "agreement_whitespace_words_detail": agree_ws,
        "machine": machine(["datatrove", "spacy", "tokenizers"]),
        "seconds": time.perf_counter() - started,
    }
    print(json.dumps(result))


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--child":
        sys.path.insert(0, str(ROOT))
        mode, *rest = sys.argv[2:]
        if mode == "ours":
            out = child_ours(rest[0], rest[1], int(rest[2]))
        else:
            sys.path.insert(0, str(ROOT / "benchmarks"))
            out = child_datatrove(rest[0], rest[1], int(rest[2]), rest[3], rest[4])
        print(json.dumps(out))
    else:
        main()
