"""Throughput and memory of the whole prepare step, against raw HF ``encode_batch``, same run.

    python benchmarks/bench_tokenize.py [--mb 128] [--big-gb 0] [--workers 2]

A corpus of ``--mb`` MB is generated (documents of random lines of the Python standard
library, in 4 MB ``.jsonl.zst`` files), then, each in a fresh process:

* ``prepare`` with 1 and with ``--workers`` processes: read, clean, exact + near dedup,
  BPE training on the sample, tokenize, pack, shard, commit to a local store;
* raw HF ``encode_batch`` of the same kept documents' text (up to ``--raw-mb``), one and
  two rayon threads, and our encoder (``encode_parallel``) on the same text, ids compared;
* ``--big-gb N``: a corpus of N GB through ``prepare`` with ``--workers`` processes.

Peak RSS is sampled every 0.2 s over the process tree (sum of RSS, which counts pages
shared by forked workers more than once: an upper bound) and for the largest process.
Prints readable lines, then one JSON object as the last line; ``ratio_*`` compare against
the raw HF figure or the 1-process figure of the same run.
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import random
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import psutil

try:
    import zstandard
except ImportError:  # an image without it: gzip instead
    zstandard = None

ROOT = Path(__file__).resolve().parents[1]
FILE_BYTES = 4 << 20


def generate(root: Path, total_bytes: int, seed: int = 0) -> int:
    """Documents of 20–200 random standard-library lines; returns the bytes of text written."""
    sys.path.insert(0, str(ROOT))
    from data_prep.sources import _stdlib_files

    lines: list[str] = []
    for path in _stdlib_files():
        try:
            lines += path.read_text(encoding="utf-8").splitlines()
        except UnicodeDecodeError:
            continue
    rng = random.Random(seed)
    root.mkdir(parents=True, exist_ok=True)
    written, index = 0, 0
    compress, suffix = (zstandard.ZstdCompressor(level=3).compress, "zst") if zstandard else (lambda b: gzip.compress(b, 6), "gz")
    while written < total_bytes:
        records, size = [], 0
        while size < FILE_BYTES and written + size < total_bytes:
            text = "\n".join(rng.choices(lines, k=rng.randint(20, 200)))
            records.append(json.dumps({"text": text}))
            size += len(text.encode())
        (root / f"part-{index:05d}.jsonl.{suffix}").write_bytes(compress(("\n".join(records) + "\n").encode()))
        written += size
        index += 1
    return written


def run_child(args: list[str]) -> tuple[dict, float, float, float]:
    """Run this script in ``--child`` mode; returns its JSON, wall seconds, peak RSS sum and max (MiB)."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])))
    start = time.perf_counter()
    proc = subprocess.Popen([sys.executable, __file__, "--child", *args], stdout=subprocess.PIPE, env=env, text=True)
    peak_sum = peak_max = 0.0
    stop = threading.Event()

    def sample() -> None:
        nonlocal peak_sum, peak_max
        parent = psutil.Process(proc.pid)
        while not stop.is_set():
            try:
                rss = [p.memory_info().rss for p in [parent, *parent.children(recursive=True)]]
            except psutil.Error:
                rss = []
            if rss:
                peak_sum, peak_max = max(peak_sum, sum(rss)), max(peak_max, max(rss))
            stop.wait(0.2)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    out, _ = proc.communicate()
    wall = time.perf_counter() - start
    stop.set()
    sampler.join()
    if proc.returncode:
        raise SystemExit(f"child {args} failed with exit code {proc.returncode}")
    return json.loads(out.strip().splitlines()[-1]), wall, peak_sum / 2**20, peak_max / 2**20


# --- child modes ------------------------------------------------------------------------
def child_prepare(corpus: str, store: str, workers: int) -> dict:
    import resource

    from data_prep.config import DataConfig, TokenizerConfig
    from data_prep.prepare import prepare_dataset
    from storage import open_store

    start = time.perf_counter()
    ref = prepare_dataset(DataConfig(sources=[corpus], workers=workers), TokenizerConfig(), open_store(store))
    seconds = time.perf_counter() - start
    own, workers_usage = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return {
        "seconds": seconds,
        "version": ref.version,
        "stats": ref.stats,
        # CPU seconds: on a machine shared with other jobs, wall time understates scaling.
        "parent_cpu": own.ru_utime + own.ru_stime,
        "workers_cpu": workers_usage.ru_utime + workers_usage.ru_stime,
    }


def _kept_texts(dataset: Path, corpus: str, limit: int) -> list[str]:
    """The cleaned text of the kept documents, in order, up to ``limit`` bytes."""
    import csv

    from data_prep.clean import clean_text
    from data_prep.readers import Skips, iter_documents
    from data_prep.sources import list_files

    with open(dataset / "doc_stats.csv") as f:
        kept = {row["source"] for row in csv.DictReader(f)}
    texts, size = [], 0
    for doc in iter_documents(list_files([corpus]), "text", 8_000_004, Skips(quiet=True)):
        if doc.source in kept:
            text = clean_text(doc.text)
            texts.append(text)
            size += len(text.encode())
            if size >= limit:
                break
    return texts


def child_encode(dataset: str, corpus: str, limit: int, threads: int) -> dict:
    os.environ["RAYON_NUM_THREADS"] = str(threads)  # before tokenizers starts its thread pool
    from tokenizers import Tokenizer

    from data_prep.tokenizer import encode_parallel

    texts = _kept_texts(Path(dataset), corpus, limit)
    mb = sum(len(t.encode()) for t in texts) / 1e6
    tokenizer = Tokenizer.from_file(str(Path(dataset) / "tokenizer.json"))
    start = time.perf_counter()
    raw = tokenizer.encode_batch(texts)
    raw_s = time.perf_counter() - start
    start = time.perf_counter()
    ours = encode_parallel(tokenizer, texts, workers=threads)
    ours_s = time.perf_counter() - start
    identical = all(a.tolist() == e.ids for a, e in zip(ours, raw, strict=True))
    return {"mb": mb, "raw_seconds": raw_s, "ours_seconds": ours_s, "identical_ids": identical}


def child(argv: list[str]) -> None:
    mode, *rest = argv
    if mode == "prepare":
        result = child_prepare(rest[0], rest[1], int(rest[2]))
    else:
        result = child_encode(rest[0], rest[1], int(rest[2]), int(rest[3]))
    print(json.dumps(result))


# --- the benchmark ----------------------------------------------------------------------
def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mb", type=int, default=128, help="corpus size for the throughput runs")
    parser.add_argument("--raw-mb", type=int, default=16, help="text for the raw encode_batch comparison")
    parser.add_argument("--workers", type=int, default=2, help="processes of the parallel run")
    parser.add_argument("--big-gb", type=float, default=0.0, help="also run a corpus this big (memory figure)")
    parser.add_argument("--tmp", default=None, help="where to generate corpora (default: system temp)")
    parser.add_argument("--only-big", action="store_true", help="skip the throughput runs")
    args = parser.parse_args()
    result: dict = {"cpu_count": os.cpu_count(), "workers": args.workers}
    if not args.only_big:
        result |= throughput(args)
    if args.big_gb:
        result |= big(args)
    for key, value in result.items():
        print(f"  {key:<40} {value}")
    print(json.dumps(result))


def throughput(args: argparse.Namespace) -> dict:
    result: dict = {}
    with tempfile.TemporaryDirectory(prefix="bench-tokenize-", dir=args.tmp) as tmp:
        corpus = Path(tmp) / "corpus"
        mb = generate(corpus, args.mb * 10**6) / 1e6
        result["corpus_mb"] = round(mb, 1)
        runs = {}
        for workers in (1, args.workers):
            out, wall, rss_sum, rss_max = run_child(["prepare", str(corpus), f"{tmp}/store-{workers}", str(workers)])
            runs[workers] = out
            result[f"prepare_mb_s_{workers}"] = round(mb / out["seconds"], 2)
            result[f"prepare_mb_s_per_core_{workers}"] = round(mb / out["seconds"] / workers, 2)
            result[f"prepare_peak_rss_mib_{workers}"] = round(rss_sum)
            result[f"prepare_peak_rss_max_process_mib_{workers}"] = round(rss_max)
            result[f"prepare_cpu_s_parent_{workers}"] = round(out["parent_cpu"], 1)
            result[f"prepare_cpu_s_workers_{workers}"] = round(out["workers_cpu"], 1)
        assert runs[1]["version"] == runs[args.workers]["version"], "worker count changed the dataset"
        stats = runs[1]["stats"]
        result["documents_kept"] = stats["documents_kept"]
        result["duplicates"] = stats["duplicates_total"]
        result["tokens"] = stats["train_tokens"] + stats["val_tokens"]
        parallel = result[f"prepare_mb_s_{args.workers}"]
        result["ratio_prepare_scaling"] = round(parallel / (args.workers * result["prepare_mb_s_1"]), 3)
        # The ratio idle cores would give, from CPU seconds: on N cores the parallel run takes
        # at least its parent's time, each worker's share, and all its CPU time over N.
        serial = runs[1]["parent_cpu"] + runs[1]["workers_cpu"]
        parent, workers = runs[args.workers]["parent_cpu"], runs[args.workers]["workers_cpu"]
        critical = max(parent, workers / args.workers, (parent + workers) / args.workers)
        result["ratio_prepare_scaling_cpu_bound"] = round(serial / (args.workers * critical), 3)

        dataset = next((Path(tmp) / "store-1" / "datasets").iterdir())
        for threads in (1, 2):
            enc, *_ = run_child(["encode", str(dataset), str(corpus), str(args.raw_mb * 10**6), str(threads)])
            assert enc["identical_ids"], "our encoder's ids differ from HF encode_batch"
            result["raw_text_mb"] = round(enc["mb"], 1)
            result[f"raw_encode_batch_mb_s_{threads}"] = round(enc["mb"] / enc["raw_seconds"], 2)
            result[f"ours_encode_mb_s_{threads}"] = round(enc["mb"] / enc["ours_seconds"], 2)
        result["identical_ids"] = True
        result["ratio_raw_scaling"] = round(result["raw_encode_batch_mb_s_2"] / (2 * result["raw_encode_batch_mb_s_1"]), 3)
        result["ratio_ours_encode_scaling"] = round(result["ours_encode_mb_s_2"] / (2 * result["ours_encode_mb_s_1"]), 3)
        result["ratio_ours_encode_vs_raw_1"] = round(result["ours_encode_mb_s_1"] / result["raw_encode_batch_mb_s_1"], 2)
        per_core = result["prepare_mb_s_per_core_1"]
        result["ratio_prepare_per_core_vs_raw_1"] = round(per_core / result["raw_encode_batch_mb_s_1"], 2)
    return result


def big(args: argparse.Namespace) -> dict:
    """A corpus of several GB through prepare: the memory figure."""
    result: dict = {}
    with tempfile.TemporaryDirectory(prefix="bench-tokenize-big-", dir=args.tmp) as tmp:
        start = time.perf_counter()
        big_mb = generate(Path(tmp) / "corpus", int(args.big_gb * 10**9), seed=1) / 1e6
        result["big_generate_seconds"] = round(time.perf_counter() - start)
        out, _, rss_sum, rss_max = run_child(["prepare", f"{tmp}/corpus", f"{tmp}/store", str(args.workers)])
        result["big_corpus_mb"] = round(big_mb)
        result["big_prepare_seconds"] = round(out["seconds"])
        result["big_prepare_mb_s"] = round(big_mb / out["seconds"], 2)
        result["big_peak_rss_mib"] = round(rss_sum)
        result["big_peak_rss_max_process_mib"] = round(rss_max)
        result["big_documents_kept"] = out["stats"]["documents_kept"]
        result["big_tokens"] = out["stats"]["train_tokens"] + out["stats"]["val_tokens"]
    return result


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--child":
        sys.path.insert(0, str(ROOT))
        child(sys.argv[2:])
    else:
        main()
