"""Tokenization per core on four text classes against HF ``encode_batch_fast`` and tiktoken, and
the whole prepare step with 1 and 2 processes, every ratio taken inside one run.

    python benchmarks/bench_tokenize.py [--mb 3] [--prepare-mb 12] [--repeats 3] [--quick]
                                        [--profile] [--big-gb 0]

Text classes, each about ``--mb`` MB, built from text on this machine (nothing generated but the
emoji placement):

* ``code``: Python standard library files, whole, each once;
* ``prose``: English documentation: ``*.md`` / ``*.rst`` / ``METADATA`` of the installed Python
  packages and READMEs / ``*.txt`` / ``*.md`` under ``/usr/share/doc``, each file once;
* ``multilingual``: the translated messages of the gettext catalogs (``/usr/share/locale/<lang>/
  LC_MESSAGES/*.mo``) in Simplified and Traditional Chinese, Japanese, Korean, Arabic, Persian,
  Russian, Ukrainian and Hindi (Devanagari), 40 messages a document, a language per document in
  turn; a seeded generator appends 1-3 emoji to 15% of the messages (no such text is on the machine);
* ``mixed``: the three, a document of each in turn.

A byte-level BPE of 8,192 tokens is trained by our pipeline (``data_prep.tokenizer.train_tokenizer``)
on ``mixed``. Per class, each repeat times, in an order that rotates every repeat, one core each
(``RAYON_NUM_THREADS=1``, one process):

* ours: ``FastBPE.encode_batch`` (data_prep/encoder.py), a new encoder every repeat (empty caches);
* HF: ``Tokenizer.encode_batch_fast`` (no offsets: HF's fastest call) on a new ``Tokenizer``
  every repeat (empty BPE cache);
* tiktoken: an ``Encoding`` built from the same vocabulary and merges (``mergeable_ranks``: each
  token's bytes → its id, merges in id order) and the same GPT-2 pre-tokenizer regex,
  ``encode(text, allowed_special="all")`` per document (special tokens in the text read as HF reads them).

Ids are compared with HF's on every class: ours must be identical (checked: the run stops with the
first difference otherwise); tiktoken's are counted (``tiktoken_identical_docs_<class>``) and the
first difference is printed.

Prepare (``prepare_dataset`` end to end: read, clean, filter, exact + near dedup, BPE training,
encode, pack, shard, commit to a local store) runs on ``--prepare-mb`` MB of ``mixed`` documents in
``.jsonl.zst`` files, in a fresh process per run, 1 and 2 worker processes alternating. Peak RSS is
sampled every 0.2 s over the process tree. ``--profile`` also runs prepare once (1 process) under
cProfile and prints the time by stage; in that run the trainer gets its sample as a list, so the scan
pass that produces it is profiled apart from BPE training.

The last line is one JSON object: ``ratios`` / ``spread`` (ratio > 1: ours faster):
``<class>_vs_hf_fast``, ``mixed_vs_tiktoken``, ``prepare_scaling_2_processes`` (2-process MB/s over
twice the 1-process MB/s) and ``prepare_mb_s_per_core`` (a figure in MB/s, not a ratio: the
1-process run). Kept keys: ``corpus_mb``, ``prepare_*``, ``documents_kept``, ``duplicates``,
``tokens``, ``ratio_prepare_scaling`` (= ``prepare_scaling_2_processes``),
``ratio_prepare_scaling_cpu_bound``, ``identical_ids``, ``ours_encode_mb_s_1`` (ours on ``mixed``),
``big_*``: medians over the repeats. Retired, as they measured the issue-14 faults: ``raw_*``
and ``ratio_raw_scaling`` (HF ``encode_batch``, not ``encode_batch_fast``, on random standard-library
lines), ``ratio_ours_encode_vs_raw_1`` and ``ratio_prepare_per_core_vs_raw_1`` (ratios of runs made
minutes apart), ``ours_encode_mb_s_2`` / ``ratio_ours_encode_scaling``.
"""

from __future__ import annotations

import os
import sys

if "--child" not in sys.argv:
    # One thread per encoder, before tokenizers starts its thread pool: per-core figures compare.
    os.environ["RAYON_NUM_THREADS"] = "1"

import argparse
import cProfile
import gettext
import gzip
import hashlib
import io
import json
import pstats
import random
import statistics
import subprocess
import tempfile
import threading
import time
import unicodedata
from collections.abc import Callable, Iterator
from pathlib import Path

import psutil
from machine_info import machine, ratio_keys, require, spread  # benchmarks/ (the script's folder)

try:
    import zstandard
except ImportError:  # an image without it: gzip instead
    zstandard = None

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
FILE_BYTES = 4 << 20
LANGUAGES = ["zh_CN", "zh_TW", "ja", "ko", "ar", "fa", "ru", "uk", "hi"]
CLASSES = ["code", "prose", "multilingual", "mixed"]
PEERS = ["ours", "hf_fast", "tiktoken"]
# GPT-2's pre-tokenizer regex, as HF's ByteLevel pre-tokenizer and tiktoken's r50k_base write it.
GPT2_PATTERN = r"""'(?:[sdmt]|ll|ve|re)| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"""


# --- text classes -----------------------------------------------------------------------
def _distinct(texts: Iterator[str], limit: int) -> list[str]:
    """Texts in order, each content once, until ``limit`` UTF-8 bytes."""
    out, seen, size = [], set(), 0
    for text in texts:
        digest = hashlib.sha1(text.encode("utf-8", "replace")).digest()
        if not text.strip() or digest in seen:
            continue
        seen.add(digest)
        out.append(text)
        size += len(text.encode("utf-8", "replace"))
        if size >= limit:
            break
    return out


def _read(path: Path) -> str | None:
    try:
        raw = gzip.decompress(path.read_bytes()) if path.suffix == ".gz" else path.read_bytes()
        return raw.decode("utf-8")
    except (OSError, UnicodeDecodeError, EOFError, gzip.BadGzipFile):
        return None


def code_texts(limit: int) -> list[str]:
    from data_prep.sources import _stdlib_files

    return _distinct((t for t in map(_read, _stdlib_files()) if t), limit)


def prose_texts(limit: int) -> list[str]:
    site = Path(psutil.__file__).resolve().parents[1]
    paths = sorted(p for pattern in ("*.md", "*.rst", "METADATA") for p in site.rglob(pattern))
    doc = Path("/usr/share/doc")
    if doc.is_dir():
        names = ("README*", "*.md", "*.txt", "*.md.gz", "*.txt.gz")
        paths += sorted(p for pattern in names for p in doc.rglob(pattern) if p.is_file())
    return _distinct((t for t in map(_read, paths) if t), limit)


def _emoji() -> list[str]:
    blocks = ((0x1F300, 0x1F5FF), (0x1F600, 0x1F64F), (0x1F680, 0x1F6FF), (0x1F90C, 0x1F9FF))
    # Only code points Python's Unicode database knows: an unknown one sends the whole text to HF.
    return [chr(c) for lo, hi in blocks for c in range(lo, hi + 1) if unicodedata.category(chr(c)) != "Cn"]


def _catalog_documents(language: str) -> list[list[str]]:
    """The translated messages of one language's gettext catalogs, 40 a document, each message once."""
    docs, seen = [], set()
    for path in sorted(Path("/usr/share/locale", language, "LC_MESSAGES").glob("*.mo")):
        try:
            with open(path, "rb") as f:
                catalog = gettext.GNUTranslations(f)._catalog
        except (OSError, UnicodeDecodeError, ValueError):
            continue
        messages = [v for k, v in sorted(catalog.items(), key=lambda kv: str(kv[0])) if k and v and v not in seen]
        seen.update(messages)
        docs += [messages[i : i + 40] for i in range(0, len(messages), 40)]
    return docs


def multilingual_texts(limit: int, seed: int = 0) -> list[str]:
    rng, emoji = random.Random(seed), _emoji()
    per_language = [d for d in map(_catalog_documents, LANGUAGES) if d]
    out, size = [], 0
    while size < limit and any(per_language):
        for docs in filter(None, per_language):
            messages = [
                m + rng.choice(["", " "]) + "".join(rng.choices(emoji, k=rng.randint(1, 3))) if rng.random() < 0.15 else m
                for m in docs.pop(0)
            ]
            out.append("\n".join(messages))
            size += len(out[-1].encode())
            if size >= limit:
                break
    return out


def text_classes(mb: float) -> dict[str, list[str]]:
    limit = int(mb * 1e6)
    classes = {"code": code_texts(limit), "prose": prose_texts(limit), "multilingual": multilingual_texts(limit)}
    classes["mixed"] = interleave(list(classes.values()), limit)
    return classes


def interleave(groups: list[list[str]], limit: int) -> list[str]:
    """A document of each group in turn (groups that run out drop out) until ``limit`` bytes."""
    out, size = [], 0
    for i in range(max(map(len, groups))):
        for group in groups:
            if i < len(group):
                out.append(group[i])
                size += len(group[i].encode("utf-8", "replace"))
        if size >= limit:
            break
    return out


def mb_of(texts: list[str]) -> float:
    return sum(len(t.encode("utf-8", "replace")) for t in texts) / 1e6


# --- encoders ---------------------------------------------------------------------------
def tiktoken_encoding(tokenizer):
    """tiktoken with our vocabulary: each token's bytes ranked by its id (HF numbers merged tokens
    in merge order, so rank order is merge order), GPT-2's regex, our special tokens."""
    import tiktoken

    from data_prep.encoder import bytes_to_unicode

    spec = json.loads(tokenizer.to_str())
    to_byte = {c: b for b, c in bytes_to_unicode().items()}
    specials = {t["content"]: t["id"] for t in spec["added_tokens"]}
    ranks = {bytes(to_byte[c] for c in token): i for token, i in spec["model"]["vocab"].items() if token not in specials}
    return tiktoken.Encoding("ours", pat_str=GPT2_PATTERN, mergeable_ranks=ranks, special_tokens=specials)


def encoders(tokenizer) -> dict[str, Callable[[], Callable[[list[str]], list[list[int]]]]]:
    """Per peer, a factory of a fresh encoder (built outside the timed part)."""
    from tokenizers import Tokenizer

    from data_prep.encoder import FastBPE

    json_spec = tokenizer.to_str()

    def ours():
        encoder = FastBPE(Tokenizer.from_str(json_spec))
        return lambda texts: [a.tolist() for a in encoder.encode_batch(texts)]

    def hf_fast():
        hf = Tokenizer.from_str(json_spec)
        return lambda texts: [e.ids for e in hf.encode_batch_fast(texts)]

    def tik():
        encoding = tiktoken_encoding(tokenizer)
        # Special tokens in the text count as such, as in HF and ours (a package's docs hold "<|endoftext|>").
        return lambda texts: [encoding.encode(t, allowed_special="all") for t in texts]

    return {"ours": ours, "hf_fast": hf_fast, "tiktoken": tik}


def first_difference(texts: list[str], got: list[list[int]], want: list[list[int]], decode) -> str:
    for i, (a, b) in enumerate(zip(got, want, strict=True)):
        if a != b:
            at = next((j for j, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), min(len(a), len(b)))
            return f"document {i}, token {at}: {decode(a[at : at + 4])!r} vs HF {decode(b[at : at + 4])!r}"
    return ""


def encode_runs(classes: dict[str, list[str]], tokenizer, repeats: int) -> tuple[dict, dict]:
    """MB/s per class and peer, per repeat, in a rotating order; ids checked on the first repeat."""
    factories = encoders(tokenizer)

    def decode(ids: list[int]) -> str:
        return tokenizer.decode(ids, skip_special_tokens=False)

    speeds = {c: {p: [] for p in PEERS} for c in classes}
    checks: dict = {}
    for name, texts in classes.items():
        mb = mb_of(texts)
        for r in range(repeats):
            ids = {}
            for peer in PEERS[r % 3 :] + PEERS[: r % 3]:
                encode = factories[peer]()
                start = time.perf_counter()
                out = encode(texts)
                speeds[name][peer].append(mb / (time.perf_counter() - start))
                if r == 0:
                    ids[peer] = out
            if r == 0:
                ours_differ = first_difference(texts, ids["ours"], ids["hf_fast"], decode)
                require(not ours_differ, f"our ids differ from HF's on {name}: {ours_differ}")
                same = sum(a == b for a, b in zip(ids["tiktoken"], ids["hf_fast"], strict=True))
                checks[f"tiktoken_identical_docs_{name}"] = f"{same}/{len(texts)}"
                checks[f"tiktoken_first_difference_{name}"] = first_difference(texts, ids["tiktoken"], ids["hf_fast"], decode)
                checks[f"tokens_{name}"] = sum(map(len, ids["hf_fast"]))
    return speeds, checks


# --- prepare, in a fresh process --------------------------------------------------------
def write_corpus(root: Path, texts: list[str]) -> float:
    """``texts`` as ``.jsonl.zst`` files of about 4 MB; returns the MB of text."""
    root.mkdir(parents=True, exist_ok=True)
    compress, suffix = (zstandard.ZstdCompressor(level=3).compress, "zst") if zstandard else (lambda b: gzip.compress(b, 6), "gz")
    records, size, index = [], 0, 0
    for text in [*texts, None]:
        if text is not None:
            records.append(json.dumps({"text": text}))
            size += len(text.encode("utf-8", "replace"))
        if records and (text is None or size >= FILE_BYTES * (index + 1)):
            (root / f"part-{index:05d}.jsonl.{suffix}").write_bytes(compress(("\n".join(records) + "\n").encode()))
            records, index = [], index + 1
    return size / 1e6


def run_child(args: list[str]) -> tuple[dict, float, float]:
    """This script in ``--child`` mode; its JSON, peak RSS sum over the tree and of its largest process (MiB)."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])))
    env.pop("RAYON_NUM_THREADS", None)  # prepare gives the BPE trainer as many threads as workers
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
    stop.set()
    sampler.join()
    if proc.returncode:
        raise SystemExit(f"child {args} failed with exit code {proc.returncode}")
    return json.loads(out.strip().splitlines()[-1]), peak_sum / 2**20, peak_max / 2**20


# Where prepare's time goes: cumulative cProfile seconds of the function that does each stage
# (reading and filters run in the scan, the tokenizer sample and the encode stages alike).
STAGES = {
    "scan_pass": ("scan.py", "scan_partition"),
    "encode_pass": ("encode.py", "encode_partition"),
    "reading": ("readers.py", "read_file"),
    "filters": ("filters.py", "filtered_text"),
    "dedup_near_rows": ("dedup.py", "near_row"),
    "dedup_exact": ("dedup_stages.py", "exact_shard"),
    "dedup_near": ("dedup_stages.py", "near_shard"),
    "resolve": ("dedup_stages.py", "resolve"),
    "bpe_training": ("tokenizer.py", "train_tokenizer"),
    "encoding": ("encoder.py", "encode_batch"),
    "shards": ("encode.py", "pack_shards"),
}


def _sample_first(train: Callable) -> Callable:
    """The trainer, fed the whole sample as a list: HF pulls a streamed sample from a thread of
    its own, where cProfile would not see the scan pass that produces it (profile run only)."""

    def train_on_list(texts, config):
        return train(list(texts), config)

    return train_on_list


def child_prepare(corpus: str, store: str, workers: int, profile: bool) -> dict:
    import resource

    from data_prep.config import DataConfig, TokenizerConfig
    from data_prep.prepare import prepare_dataset
    from storage import open_store

    profiler = cProfile.Profile() if profile else None
    if profile:
        import data_prep.prepare

        data_prep.prepare.train_tokenizer = _sample_first(data_prep.prepare.train_tokenizer)
    start = time.perf_counter()
    if profiler:
        profiler.enable()
    ref = prepare_dataset(DataConfig(sources=[corpus], workers=workers), TokenizerConfig(), open_store(store))
    if profiler:
        profiler.disable()
    seconds = time.perf_counter() - start
    own, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    result = {
        "seconds": seconds,
        "version": ref.version,
        "stats": ref.stats,
        # CPU seconds: on a machine shared with other jobs, wall time understates scaling.
        "parent_cpu": own.ru_utime + own.ru_stime,
        "workers_cpu": children.ru_utime + children.ru_stime,
    }
    if profiler:
        result["stages"] = stage_seconds(profiler)
    return result


def stage_seconds(profiler: cProfile.Profile) -> dict[str, float]:
    stats = pstats.Stats(profiler, stream=io.StringIO()).stats  # {(file, line, name): (cc, nc, tt, ct, callers)}
    out = {}
    for stage, (file, name) in STAGES.items():
        out[stage] = round(sum(v[3] for k, v in stats.items() if k[0].endswith(file) and k[2] == name), 2)
    top = sorted(stats.items(), key=lambda kv: -kv[1][2])[:12]
    out["top_self_seconds"] = {f"{Path(k[0]).name}:{k[2]}": round(v[2], 2) for k, v in top}
    return out


def prepare_runs(texts: list[str], repeats: int, workers: int, tmp: str, profile: bool) -> dict:
    corpus = Path(tmp) / "corpus"
    mb = write_corpus(corpus, texts)
    runs: dict[int, list[dict]] = {1: [], workers: []}
    for r in range(repeats):
        for w in (1, workers) if r % 2 == 0 else (workers, 1):
            out, rss_sum, rss_max = run_child(["prepare", str(corpus), f"{tmp}/store-{r}-{w}", str(w), "0"])
            runs[w].append(out | {"rss_sum": rss_sum, "rss_max": rss_max, "mb_s": mb / out["seconds"]})
    versions = {out["version"] for w in runs for out in runs[w]}
    require(len(versions) == 1, f"the worker count or the repeat changed the dataset: versions {sorted(versions)}")
    result: dict = {"corpus_mb": round(mb, 1)}
    for w, outs in runs.items():
        result[f"prepare_mb_s_{w}"] = round(statistics.median(o["mb_s"] for o in outs), 2)
        result[f"prepare_mb_s_{w}_spread"] = [round(min(o["mb_s"] for o in outs), 2), round(max(o["mb_s"] for o in outs), 2)]
        result[f"prepare_mb_s_per_core_{w}"] = round(result[f"prepare_mb_s_{w}"] / w, 2)
        result[f"prepare_peak_rss_mib_{w}"] = round(max(o["rss_sum"] for o in outs))
        result[f"prepare_peak_rss_max_process_mib_{w}"] = round(max(o["rss_max"] for o in outs))
        result[f"prepare_cpu_s_parent_{w}"] = round(statistics.median(o["parent_cpu"] for o in outs), 1)
        result[f"prepare_cpu_s_workers_{w}"] = round(statistics.median(o["workers_cpu"] for o in outs), 1)
    stats = runs[1][0]["stats"]
    result["documents_kept"] = stats["documents_kept"]
    result["duplicates"] = stats["duplicates_total"]
    result["tokens"] = stats["train_tokens"] + stats["val_tokens"]
    # The ratio idle cores would give, from CPU seconds: on N cores the parallel run takes at
    # least its parent's time, each worker's share, and all its CPU time over N.
    cpu_bound = []
    for one, par in zip(runs[1], runs[workers], strict=True):
        serial = one["parent_cpu"] + one["workers_cpu"]
        critical = max(par["parent_cpu"], par["workers_cpu"] / workers, (par["parent_cpu"] + par["workers_cpu"]) / workers)
        cpu_bound.append(serial / (workers * critical))
    result["ratio_prepare_scaling_cpu_bound"] = round(statistics.median(cpu_bound), 3)
    result["_scaling"] = [par["mb_s"] / (workers * one["mb_s"]) for one, par in zip(runs[1], runs[workers], strict=True)]
    result["_per_core"] = [o["mb_s"] for o in runs[1]]
    if profile:
        out, *_ = run_child(["prepare", str(corpus), f"{tmp}/store-profile", "1", "1"])
        result["prepare_profile_1_process_s"] = {"total": round(out["seconds"], 2)} | out["stages"]
    return result


def child(argv: list[str]) -> None:
    mode, corpus, store, workers, profile = argv
    require(mode == "prepare", f"unknown child mode {mode!r}: only 'prepare'")
    print(json.dumps(child_prepare(corpus, store, int(workers), profile == "1")))


# --- the benchmark ----------------------------------------------------------------------
def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mb", type=float, default=3.0, help="MB of text per class for the encoder runs")
    parser.add_argument("--prepare-mb", type=float, default=12.0, help="MB of mixed text through prepare")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--workers", type=int, default=2, help="processes of the parallel prepare run")
    parser.add_argument("--quick", action="store_true", help="smoke run: 0.4 MB per class, 2 MB through prepare")
    parser.add_argument("--profile", action="store_true", help="also profile one 1-process prepare run, by stage")
    parser.add_argument("--big-gb", type=float, default=0.0, help="also run a corpus this big through prepare (memory)")
    parser.add_argument("--tmp", default=None, help="where to write corpora (default: system temp)")
    args = parser.parse_args()
    if args.quick:
        args.mb, args.prepare_mb = 0.4, 2.0
    started = time.perf_counter()
    result, ratios = run(args)
    if args.big_gb:
        result |= big(args)
    result |= {
        "cpu_count": os.cpu_count(),
        "workers": args.workers,
        "repeats": args.repeats,
        "seconds": round(time.perf_counter() - started),
    }
    summary = ratio_keys(ratios)
    summary["ratios"]["prepare_mb_s_per_core"] = result["prepare_mb_s_per_core"]
    summary["spread"]["prepare_mb_s_per_core"] = result["prepare_mb_s_per_core_spread"]
    result |= summary
    result["machine"] = machine(["tokenizers", "tiktoken", "numpy", "zstandard"], rayon_threads=1)
    for key, value in result.items():
        print(f"  {key:<40} {value}")
    print(json.dumps(result))


def run(args: argparse.Namespace) -> tuple[dict, dict[str, list[float]]]:
    from data_prep.config import TokenizerConfig
    from data_prep.tokenizer import train_tokenizer

    classes = text_classes(args.mb)
    result: dict = {f"text_mb_{name}": round(mb_of(texts), 2) for name, texts in classes.items()}
    start = time.perf_counter()
    tokenizer = train_tokenizer(classes["mixed"], TokenizerConfig())
    result["tokenizer_training_s_1_thread"] = round(time.perf_counter() - start, 1)
    speeds, checks = encode_runs(classes, tokenizer, args.repeats)
    ratios: dict[str, list[float]] = {}
    for name in classes:
        for peer in PEERS:
            s = spread(speeds[name][peer])
            result[f"{peer}_mb_s_{name}"] = round(s["median"], 2)
            result[f"{peer}_mb_s_{name}_spread"] = [round(s["min"], 2), round(s["max"], 2)]
        ratios[f"{name}_vs_hf_fast"] = [o / h for o, h in zip(speeds[name]["ours"], speeds[name]["hf_fast"], strict=True)]
    ratios["mixed_vs_tiktoken"] = [o / t for o, t in zip(speeds["mixed"]["ours"], speeds["mixed"]["tiktoken"], strict=True)]
    result["ours_encode_mb_s_1"] = result["ours_mb_s_mixed"]
    result["identical_ids"] = True  # ours == HF on every class: checked in encode_runs (raises otherwise)
    result |= checks

    prepare_texts = interleave([code_texts(10**10), prose_texts(10**10), multilingual_texts(10**10)], int(args.prepare_mb * 1e6))
    with tempfile.TemporaryDirectory(prefix="bench-tokenize-", dir=args.tmp) as tmp:
        prepared = prepare_runs(prepare_texts, args.repeats, args.workers, tmp, args.profile)
    ratios["prepare_scaling_2_processes"] = prepared.pop("_scaling")
    per_core = prepared.pop("_per_core")
    result |= prepared
    result["ratio_prepare_scaling"] = round(statistics.median(ratios["prepare_scaling_2_processes"]), 3)
    result["prepare_mb_s_per_core"] = round(statistics.median(per_core), 2)
    result["prepare_mb_s_per_core_spread"] = [round(min(per_core), 2), round(max(per_core), 2)]
    return result, ratios


def generate(root: Path, total_bytes: int, seed: int = 1) -> float:
    """Documents of 20-200 random standard-library lines (the memory run only: the text classes
    above are the realistic ones); returns the MB of text written."""
    lines = [line for text in code_texts(10**10) for line in text.splitlines()]
    rng, texts, size = random.Random(seed), [], 0
    while size < total_bytes:
        texts.append("\n".join(rng.choices(lines, k=rng.randint(20, 200))))
        size += len(texts[-1].encode("utf-8", "replace"))
    return write_corpus(root, texts)


def big(args: argparse.Namespace) -> dict:
    """A corpus of several GB through prepare: the memory figure."""
    result: dict = {}
    with tempfile.TemporaryDirectory(prefix="bench-tokenize-big-", dir=args.tmp) as tmp:
        big_mb = generate(Path(tmp) / "corpus", int(args.big_gb * 1e9))
        out, rss_sum, rss_max = run_child(["prepare", f"{tmp}/corpus", f"{tmp}/store", str(args.workers), "0"])
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
        child(sys.argv[2:])
    else:
        main()
