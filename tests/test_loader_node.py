"""Each byte read once per node: four ranks launched as two simulated nodes of two (``GROUP_RANK``), in
one launch that runs three phases (``node_ranks`` below): data-parallel 4 through the node caches, a
corrupted shard, and tensor-parallel 2 × data-parallel 2, where a rank's TP peer reads nothing. Then the
node cache's own rules in one process: what it deletes, when the folder goes, a hung lock holder."""

from __future__ import annotations

import fcntl
import os
import shutil
from pathlib import Path

import numpy as np
import pytest

from data_prep.manifest import load_manifest
from data_prep.prepare import prepare_dataset
from storage import open_store
from tests.helpers import tiny_data, tiny_tokenizer
from training import shard_cache
from training.data import Reading, StreamingLoader
from training.launch import launch
from training.shard_cache import CACHE_ROOT, NodeCache

RANKS, PER_NODE, BATCH, WINDOW, SEED = 4, 2, 8, 2, 11
BAD_WINDOW = (0, 2)  # the corrupted shard is the first of this window: two windows of batches come before it


@pytest.fixture(scope="module")
def dataset(tmp_path_factory):
    store = open_store(str(tmp_path_factory.mktemp("node-store")))
    return prepare_dataset(tiny_data(max_documents=8, sequences_per_sample=4, samples_per_shard=8), tiny_tokenizer(), store)


def loader(ref, reading: Reading | None = None) -> StreamingLoader:
    return StreamingLoader.for_split(ref, "train", BATCH, SEED, window_shards=WINDOW, reading=reading)[0]


def corrupted_copy(ref, root: Path) -> tuple[object, str]:
    """The dataset in a new store with one byte of one shard (the first of ``BAD_WINDOW``) flipped."""
    shutil.copytree(Path(ref.store) / ref.prefix, root / ref.prefix)
    with loader(ref) as one:
        url = one.shards[int(one.order.shards_of(BAD_WINDOW)[0])].url
    path = root / Path(url).relative_to(ref.store)
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0xFF
    path.write_bytes(bytes(data))
    return type(ref)(**{**vars(ref), "store": str(root)}), path.name


def _epoch(one: StreamingLoader, rank: int, dp: int, barrier) -> tuple[list[np.ndarray], int]:
    """Every full step of epoch 0 (a barrier after each, as a training step's collectives): the batches and
    the most windows this rank saw in its node's cache folder."""
    batches, most = [], 0
    for step in range(one.order.rows // BATCH):
        batches.append(one.batch(step, rank, dp).tokens.numpy())
        if one.cache is not None:
            most = max(most, len(list(one.cache.folder.glob("*.npy"))))
        barrier()
    return batches, most


def node_ranks(good, bad) -> list[dict]:
    """In each of the four ranks: the three phases; every rank's record, gathered."""
    import torch.distributed as dist
    from megatron.core import parallel_state as ps

    from training.config import ParallelConfig
    from training.distributed import init_distributed, shutdown_distributed

    rank = int(os.environ["RANK"])
    os.environ["GROUP_RANK"] = str(rank // PER_NODE)  # two simulated nodes of two ranks
    dist.init_process_group("gloo")
    record: dict = {"rank": rank}
    with loader(good, Reading.of_job()) as dp4:  # data-parallel 4: every rank reads, through its node's cache
        record["dp4"], record["most_windows_on_disk"] = _epoch(dp4, rank, RANKS, dist.barrier)
        record["dp4_bytes"] = (dp4.store_bytes[0], dp4.cache_bytes[0])
    broken = loader(bad, Reading.of_job())  # not closed: the process's exit removes its node cache
    record["bad"] = []
    try:
        for step in range(broken.order.rows // BATCH):
            record["bad"].append(broken.batch(step, rank, RANKS).tokens.numpy())
    except Exception as e:  # noqa: BLE001 - the test judges it: a DataError naming the shard's sha256
        cached = [p.name for p in broken.cache.folder.glob("*.npy")] if broken.cache else []
        record["refused"] = (step, f"{type(e).__name__}: {e}", cached)
    init_distributed(ParallelConfig(tensor_parallel=2), SEED)  # TP 2 × DP 2: ranks 0 and 2 read
    dp_rank, dp_size = ps.get_data_parallel_rank(), ps.get_data_parallel_world_size()
    with loader(good, reading := Reading.of_job()) as tp2:
        record["tp2"], _ = _epoch(tp2, dp_rank, dp_size, dist.barrier)
        record["tp2_reads"], record["tp2_bytes"] = reading.reads, (tp2.store_bytes[0], tp2.cache_bytes[0])
    records: list = [None] * RANKS
    dist.all_gather_object(records, record)
    shutdown_distributed()
    return records


@pytest.fixture(scope="module")
def launched(dataset, tmp_path_factory):
    """The launch, with the ranks' temporary folder (the node caches' root) under a folder of its own."""
    bad, bad_name = corrupted_copy(dataset, tmp_path_factory.mktemp("corrupted-store"))
    tmp = tmp_path_factory.mktemp("rank-tmp")
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("TMPDIR", str(tmp))
        records = launch(node_ranks, RANKS, dataset, bad)
    return records, bad_name, tmp / f"{CACHE_ROOT}-{os.getuid()}"


def dataset_bytes(ref) -> int:
    return sum(s["bytes"] for s in load_manifest(open_store(ref.store), ref)["splits"]["train"]["shards"])


def slices(ref, step: int, dp: int) -> list[np.ndarray]:
    """Step ``step``'s global batch from a single-rank loader, cut into ``dp`` data-parallel slices."""
    with loader(ref) as one:
        return np.split(one.batch(step).tokens.numpy(), dp)


def test_each_node_fetches_the_dataset_once_and_the_batches_are_a_single_ranks(dataset, launched):
    records, _, cache_root = launched
    with loader(dataset) as one:
        steps = one.order.rows // BATCH
        whole = [one.batch(step).tokens.numpy() for step in range(steps)]
    for node in range(RANKS // PER_NODE):
        ranks = records[node * PER_NODE : (node + 1) * PER_NODE]
        assert sum(r["dp4_bytes"][0] for r in ranks) == dataset_bytes(dataset), [r["dp4_bytes"] for r in ranks]
        assert sum(r["dp4_bytes"][1] for r in ranks) > 0  # the node's other rank read windows from the cache
    for r in records:
        for step in range(steps):
            assert np.array_equal(r["dp4"][step], np.split(whole[step], RANKS)[r["rank"]]), (r["rank"], step)
        assert r["most_windows_on_disk"] <= 4  # a step's window (or two), the prefetched one, a peer's lag
    assert list(cache_root.iterdir()) == []  # every node cache removed, the unclosed one at the ranks' exit


def test_a_corrupted_shard_is_refused_before_its_rows_are_used(dataset, launched):
    records, bad_name, _ = launched
    with loader(dataset) as one:
        for r in records:
            steps = range(one.order.rows // BATCH)
            first = next(s for s in steps if BAD_WINDOW in [k for k, _ in one.order.locate(one.positions(s, r["rank"], RANKS))])
            step, message, cached = r["refused"]
            assert step == first and len(r["bad"]) == first
            assert message.startswith("DataError: ") and bad_name in message and "sha256" in message, message
            assert f"{BAD_WINDOW[0]}-{BAD_WINDOW[1]}.npy" not in cached  # never written to the node's cache
            for s, tokens in enumerate(r["bad"]):
                assert np.array_equal(tokens, np.split(one.batch(s).tokens.numpy(), RANKS)[r["rank"]])


def test_a_tensor_parallel_peer_reads_nothing_and_gets_the_same_batches(dataset, launched):
    records, _, _ = launched
    assert [r["tp2_reads"] for r in records] == [True, False, True, False]
    assert [r["tp2_bytes"] for r in records] == [(dataset_bytes(dataset), 0), (0, 0)] * 2  # one reader per node
    with loader(dataset) as one:
        for step in range(one.order.rows // BATCH):
            halves = np.split(one.batch(step).tokens.numpy(), 2)
            for r in records:
                assert np.array_equal(r["tp2"][step], halves[r["rank"] // 2]), (r["rank"], step)


def test_the_node_cache_keeps_what_a_reader_needs_and_goes_with_the_last(tmp_path, monkeypatch):
    """Two readers of one node in one process: a window goes once both are past it, the folder with the
    last one; a window whose lock a hung peer holds is fetched after ``LOCK_WAIT_S``."""
    monkeypatch.setattr(shard_cache, "root", lambda: tmp_path / CACHE_ROOT)
    monkeypatch.setattr(shard_cache, "LOCK_WAIT_S", 0.2)
    first, second = (NodeCache.open("job-node0", rank, readers=2) for rank in (0, 1))
    rows = {w: np.full((3, 5), w, dtype=np.uint16) for w in range(3)}
    for w in range(3):
        assert first.window((0, w), lambda w=w: rows[w])[1]  # built by the first
        mapped, built = second.window((0, w), lambda: pytest.fail("fetched twice"))
        assert not built and np.array_equal(mapped, rows[w])
    on_disk = lambda: sorted(p.name for p in first.folder.glob("*.npy"))  # noqa: E731
    first.advance((0, 2))
    assert on_disk() == ["0-0.npy", "0-1.npy", "0-2.npy"]  # the second has not said where it is
    second.advance((0, 1))
    assert on_disk() == ["0-1.npy", "0-2.npy"]
    first.close()  # done: it holds nothing back any more
    second.advance((0, 2))
    assert on_disk() == ["0-2.npy"]

    hung = os.open(second.folder / "0-3.lock", os.O_RDWR | os.O_CREAT)
    fcntl.flock(hung, fcntl.LOCK_EX)  # a peer that took the lock and hangs
    assert second.window((0, 3), lambda: rows[0])[1]
    os.close(hung)
    second.close()
    assert not second.folder.exists() and list((tmp_path / CACHE_ROOT).iterdir()) == []
