"""Blends: the order of components (data_prep.blend), and the loader that streams a blend (training.blend) over
tiny committed datasets whose rows say where they came from: ``[component, row index, 0, …]``."""

from __future__ import annotations

import dataclasses
import json
import time
from pathlib import Path

import numpy as np
import pytest

from common.contracts import MANIFEST, DatasetRef, dataset_prefix
from data_prep.blend import BlendOrder
from data_prep.errors import DataError
from data_prep.manifest import version_of
from data_prep.shards import write_shards
from storage import open_store
from training.blend import BlendedLoader, open_loader
from training.data import LoaderStateError, StreamingLoader

ROW = 5  # seq_len + 1
# (name, weight, train shards × rows per shard): "code" cycles many epochs in a run, "web" not one.
PARTS = [("code", 0.5, 2, 8), ("web", 0.3, 8, 32), ("math", 0.2, 3, 16)]
BATCH, STEPS = 16, 40


def shares_bound(order: BlendOrder, n: int) -> np.ndarray:
    """The module's bound on |count − w·n|: under 1 + n/period for up to three components."""
    q = order.units / order.period
    return (1 + q * (order.components - 2)) / 2 + n / order.period


@pytest.mark.parametrize(
    "weights",
    [(0.7, 0.2, 0.1), (1 / 3, 1 / 3, 1 / 3), (0.999, 0.001), (0.75, 0.25), (0.4, 0.3, 0.2, 0.1), (0.97, 0.01, 0.01, 0.01)],
)
@pytest.mark.parametrize("period", [997, 4096])
def test_every_prefix_keeps_the_weights_and_every_window_holds_every_component(weights, period):
    order = BlendOrder(weights, period)
    assert order.units.sum() == period and order.units.min() >= 1
    n = 3 * period + 7
    component, local = order.locate(np.arange(n))
    seen = np.zeros((n + 1, len(weights)), dtype=np.int64)
    seen[np.arange(1, n + 1), component] = 1
    seen = np.cumsum(seen, axis=0)  # samples of each component in [0, m)
    for m in [*range(0, n + 1, 7), *range(period - 50, period + 50), n]:
        assert np.array_equal(order.counts(m), seen[m]), m
    m = np.arange(n + 1)[:, None]
    deviation = np.abs(seen - order.weights * m)
    assert np.all(deviation <= shares_bound(order, 0) + m / period + 1e-9)
    if len(weights) <= 3:
        assert np.all(deviation <= 1 + m / period + 1e-9)
    for c in range(len(weights)):  # the k-th sample of c is c's local position k
        assert np.array_equal(local[component == c], np.arange(np.count_nonzero(component == c)))
    # Every window of 1/q_c + C − 1 positions holds c (no two of its samples further apart, nor from either end),
    # so every global batch that long holds every component.
    window = int(np.ceil(period / order.units.min())) + len(weights) - 1
    for c in range(len(weights)):
        assert np.diff([-1, *np.flatnonzero(component == c), n]).max() <= window, c


def test_a_period_of_a_million_builds_fast_and_far_positions_are_exact():
    t0 = time.perf_counter()
    order = BlendOrder([0.4, 0.3, 0.2, 0.1])
    assert time.perf_counter() - t0 < 0.5
    far = np.arange(10**12, 10**12 + 2**21)  # two periods of positions, 1e12 in
    component, local = order.locate(far)
    start = order.counts(10**12)
    for c in range(4):
        assert np.array_equal(local[component == c], start[c] + np.arange(np.count_nonzero(component == c)))
    assert np.array_equal(order.counts(10**12 + 2**21) - start, np.bincount(component, minlength=4))
    with pytest.raises(ValueError, match="non-negative"):
        BlendOrder([0.5, -0.5])


def commit(store, root: Path, manifest: dict, staging: Path | None = None) -> DatasetRef:
    """The dataset of ``manifest`` committed in ``store`` (at ``root``), with the shards written in ``staging``."""
    version, data = version_of(manifest)
    folder = root / dataset_prefix(version)
    folder.mkdir(parents=True)
    for path in staging.iterdir() if staging else []:
        path.rename(folder / path.name)
    (folder / MANIFEST).write_bytes(data)
    store.commit(dataset_prefix(version))
    return DatasetRef(str(root), version, dataset_prefix(version))


def component(store, root: Path, c: int, shards: int, rows: int) -> DatasetRef:
    """A committed dataset of ``shards`` train shards (and one val shard) of rows ``[c, index, 0, …]``."""
    staging = root / f"staging-{c}"
    splits = {}
    for split, n, per in (("train", shards * rows, rows), ("val", 4, 4)):
        tokens = np.zeros((n, ROW), dtype=np.int32)
        tokens[:, 0], tokens[:, 1] = c, np.arange(n)
        splits[split] = {"shards": [dataclasses.asdict(s) for s in write_shards(tokens, staging, split, 1, per)]}
    return commit(store, root, {"seq_len": ROW - 1, "splits": splits}, staging)


@pytest.fixture(scope="module")
def blend(tmp_path_factory) -> DatasetRef:
    root = tmp_path_factory.mktemp("blend-store")
    store = open_store(str(root))
    refs = [component(store, root, c, shards, rows) for c, (_, _, shards, rows) in enumerate(PARTS)]
    mixture = [
        {"name": name, "weight": w, "max_epochs": 100.0, "dataset": ref.version, "prefix": ref.prefix}
        for (name, w, _, _), ref in zip(PARTS, refs, strict=True)
    ]
    splits = {}
    for split in ("train", "val"):
        entries = []
        for c, ref in enumerate(refs):
            own = json.loads((root / ref.prefix / MANIFEST).read_bytes())["splits"][split]["shards"]
            entries += [{**s, "prefix": ref.prefix, "component": c} for s in own]
        splits[split] = {"shards": entries}
    return commit(store, root, {"seq_len": ROW - 1, "splits": splits, "mixture": mixture})


def blended(ref: DatasetRef, seed: int = 3, **kwargs) -> BlendedLoader:
    loader, manifest = open_loader(ref, "train", BATCH, seed, window_shards=2, **kwargs)
    assert isinstance(loader, BlendedLoader) and "mixture" in manifest
    return loader


def test_the_share_of_each_component_follows_its_weight_and_each_cycles_its_own_epochs(blend):
    with blended(blend) as loader:
        rows = np.concatenate([loader.batch(step).tokens.numpy() for step in range(STEPS)])
        assert loader.samples_per_component(STEPS) == {n: int(np.sum(rows[:, 0] == c)) for c, (n, *_) in enumerate(PARTS)}
        assert loader.store_bytes[0] > 0 and loader.global_batch_size == BATCH and loader.version == blend.version
    for c, (_, weight, shards, per) in enumerate(PARTS):
        mine = rows[rows[:, 0] == c, 1]
        assert abs(len(mine) / len(rows) - weight) < 0.01
        size = shards * per
        for epoch in range(len(mine) // size):  # every full epoch visits each row once, in its own shuffle
            assert sorted(mine[epoch * size : (epoch + 1) * size]) == list(range(size))
    code, web = rows[rows[:, 0] == 0, 1], rows[rows[:, 0] == 1, 1]
    assert len(code) > 10 * 16 and not np.array_equal(code[:16], code[16:32])  # 20 epochs, each shuffled anew
    assert len(np.unique(web)) == len(web)  # 192 of 256 rows: none twice


def test_global_batches_do_not_depend_on_data_parallel_size_and_a_resume_continues(blend):
    with blended(blend) as one:
        whole = {step: one.batch(step).tokens for step in range(0, STEPS, 3)}
    for dp in (2, 4):
        with blended(blend) as other:
            for step, tokens in whole.items():
                assert np.array_equal(np.concatenate([other.batch(step, r, dp).tokens for r in range(dp)]), tokens)
    with blended(blend) as resumed:  # a fresh loader, asked for step 33 first
        assert np.array_equal(resumed.batch(33).tokens, whole[33])
    with blended(blend, seed=4) as other_seed:
        assert not np.array_equal(other_seed.batch(33).tokens, whole[33])


def test_origin_names_the_component_shards_and_rows_of_a_batch(blend):
    with blended(blend) as loader:
        tokens = loader.batch(7).tokens.numpy()
        origin = loader.origin(7)
    assert origin["step"] == 8
    found = []
    for entry in origin["shards"]:
        c = [name for name, *_ in PARTS].index(entry["component"])
        shard = int(Path(entry["shard"]).stem.rpartition("-")[2])
        found += [(c, shard * PARTS[c][3] + row) for row in entry["rows"]]
    assert sorted(found) == sorted(map(tuple, tokens[:, :2].tolist()))


def test_a_checkpoint_of_another_blend_or_of_one_dataset_is_refused(blend):
    with blended(blend) as loader:
        state = loader.state_dict(12)
        assert state["format"] == "blend-v1" and state["consumed_samples"] == 12 * BATCH
        assert state["component_samples"] == loader.samples_per_component(12)
        assert sum(state["component_samples"].values()) == 12 * BATCH
        loader.check_resume(state, 12)
        with pytest.raises(LoaderStateError, match="consumed_samples: checkpoint 192 vs now 176"):
            loader.check_resume(state, 11)
        reweighted = BlendedLoader(list(zip(loader.names, loader.loaders, strict=True)), [0.2, 0.3, 0.5], BATCH, 3, blend.version)
        with pytest.raises(LoaderStateError, match=r"component 0: checkpoint code \(dataset \w+, 524288 units\) vs now code"):
            reweighted.check_resume(state, 12)
        fewer = {**state, "components": state["components"][:2]}
        with pytest.raises(LoaderStateError, match="component 2: checkpoint none vs now math"):
            loader.check_resume(fewer, 12)
        with pytest.raises(DataError, match="components code .*, web .* are the same dataset"):
            BlendedLoader([("code", loader.loaders[0]), ("web", loader.loaders[0])], [0.5, 0.5], BATCH, 3, blend.version)
        plain = StreamingLoader(loader.loaders[1].shards, BATCH, 3, "other")
        with pytest.raises(LoaderStateError, match="'shard-window-v1' .*not a blend's"):
            loader.check_resume(plain.state_dict(12), 12)
        with pytest.raises(LoaderStateError, match="format: checkpoint 'blend-v1'"):
            plain.check_resume(state, 12)


def test_a_blends_validation_split_is_the_concatenation_of_its_components(blend):
    loader, _ = open_loader(blend, "val", 4, 3)
    with loader:
        assert type(loader) is StreamingLoader and loader.order.rows == 12
        rows = loader.rows_at(np.arange(12)).tokens.numpy()
    assert sorted(map(tuple, rows[:, :2].tolist())) == [(c, i) for c in range(3) for i in range(4)]


def test_a_blend_with_a_model_parallel_group_broadcasts_from_its_reader(blend, tmp_path):
    """In one process (a group of one): the reader's path through ``shared_batch`` gives the batch it reads."""
    import torch.distributed as dist

    from training.data import Reading

    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'rendezvous'}", rank=0, world_size=1)
    try:
        with blended(blend, reading=Reading(peers=dist.group.WORLD)) as shared, blended(blend) as alone:
            assert np.array_equal(shared.batch(5, 1, 2).tokens, alone.batch(5, 1, 2).tokens)
    finally:
        dist.destroy_process_group()
