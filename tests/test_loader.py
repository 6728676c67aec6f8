"""The streaming loader on real WebDataset shards, from a local folder and from SeaweedFS S3."""

import time
from collections import Counter

import numpy as np
import pytest

from data_prep.prepare import prepare_dataset
from data_prep.shards import read_rows
from storage import open_store
from tests.helpers import tiny_data, tiny_tokenizer
from training.data import LoaderStateError, StreamingLoader, load_split

# Few documents in small shards (32 rows each): dozens of shards, so that windows matter.
SMALL_SHARDS = dict(max_documents=8, sequences_per_sample=4, samples_per_shard=8)


@pytest.fixture(scope="module")
def many_shards(tmp_path_factory):
    store = open_store(str(tmp_path_factory.mktemp("loader-store")))
    return prepare_dataset(tiny_data(**SMALL_SHARDS), tiny_tokenizer(), store)


def loader(dataset, batch: int = 8, seed: int = 7, **kwargs) -> StreamingLoader:
    return StreamingLoader.for_split(dataset, "train", batch, seed, **kwargs)[0]


def rows_as_keys(tokens) -> list[bytes]:
    return [row.tobytes() for row in np.asarray(tokens, dtype=np.int64)]


def test_global_order_does_not_depend_on_data_parallel_size(many_shards):
    with loader(many_shards) as one, loader(many_shards) as other:
        for step in range(0, 40, 3):  # crosses windows and epochs
            whole = one.batch(step).tokens
            for dp in (2, 4):
                parts = [other.batch(step, r, dp).tokens for r in range(dp)]
                assert np.array_equal(np.concatenate(parts), whole)


def test_each_epoch_visits_every_row_once_and_epochs_differ(many_shards):
    all_rows, _ = load_split(many_shards, "train")
    n = len(all_rows)
    with loader(many_shards, window_shards=3) as one:
        assert one.order.rows == n and len(one.shards) > 6
        epoch0 = one.rows_at(np.arange(n)).tokens
        epoch1 = one.rows_at(np.arange(n, 2 * n)).tokens
    assert Counter(rows_as_keys(epoch0)) == Counter(rows_as_keys(all_rows))
    assert Counter(rows_as_keys(epoch1)) == Counter(rows_as_keys(all_rows))
    assert not np.array_equal(epoch0, epoch1)
    assert not np.array_equal(epoch0, all_rows)  # shuffled, not the file order


def test_order_is_a_function_of_seed_version_and_step(many_shards):
    with loader(many_shards) as a, loader(many_shards) as b, loader(many_shards, seed=8) as c:
        later_first = [b.batch(s).tokens for s in (9, 2, 5)]  # any access order gives the same batches
        assert all(np.array_equal(a.batch(s).tokens, t) for s, t in zip((9, 2, 5), later_first, strict=True))
        assert not np.array_equal(a.batch(2).tokens, c.batch(2).tokens)


def test_memory_is_bounded_and_waits_are_measured(many_shards):
    with loader(many_shards, batch=4, window_shards=2, prefetch_windows=1) as one:
        first = one.batch(0)
        assert first.wait_s > 0  # nothing was prefetched yet
        held = []
        for step in range(1, 60):
            assert one.batch(step).wait_s >= 0
            held.append(len(one._windows))
        # A step may straddle two windows, plus the one read ahead.
        assert max(held) <= 3


def test_prefetch_hides_reads_behind_compute(many_shards):
    with loader(many_shards, batch=32, window_shards=1) as one:  # one shard per step, a new window each step
        assert one.batch(0).wait_s > 0
        for step in range(1, 4):
            time.sleep(0.3)  # the step's compute, while the next shard is read
            assert one.batch(step).wait_s < 0.05


def test_loader_state_checks_the_sequence_on_resume(many_shards):
    with loader(many_shards) as one:
        state = one.state_dict(12)
        assert state["consumed_samples"] == 96
        one.check_resume(state, 12)
        with pytest.raises(LoaderStateError, match="consumed_samples: checkpoint 96 vs now 88"):
            one.check_resume(state, 11)
    with loader(many_shards, seed=8) as other, pytest.raises(LoaderStateError, match="seed: checkpoint 7 vs now 8"):
        other.check_resume(state, 12)


def test_streams_the_same_rows_from_s3_and_local(many_shards, s3_store):
    s3_store.upload_dir(f"{many_shards.store}/{many_shards.prefix}", many_shards.prefix)  # with its commit marker
    remote = type(many_shards)(**{**vars(many_shards), "store": s3_store.uri})
    with loader(many_shards) as local, loader(remote) as s3:
        assert s3.shards[0].url.startswith("s3://")
        for step in (0, 7, 31):
            assert np.array_equal(local.batch(step, 1, 2).tokens, s3.batch(step, 1, 2).tokens)


def test_a_shard_that_disagrees_with_the_manifest_is_an_error(many_shards, tmp_path):
    with loader(many_shards, window_shards=1) as one:
        short = one.shards[0]
        one.shards[0] = type(short)(short.url, short.sequences + 1)
        with pytest.raises(ValueError, match="holds 32 sequences, the manifest says 33"):
            one.rows_at(np.arange(one.order.rows))
    assert len(read_rows([short.url])) == 32
