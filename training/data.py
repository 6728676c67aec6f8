"""Training batches from a dataset's WebDataset shards.

The global sample order is a function of (dataset, seed, step) alone: every epoch is a
seeded permutation of all rows, the optimizer step ``s`` consumes global positions
``[s·G, (s+1)·G)`` and a data-parallel rank takes its contiguous slice of them. The
same step therefore sees the same sequences whatever the data-parallel size, and the
loader's whole state is the step number kept in the checkpoint.
"""

from __future__ import annotations

import numpy as np
import torch

from data_prep.prepare import DatasetRef, load_manifest, shard_urls
from data_prep.shards import read_rows
from storage import open_store


def load_split(ref: DatasetRef, split: str) -> tuple[np.ndarray, dict]:
    """All rows of a split (``[rows, seq_len + 1]``) and the dataset manifest."""
    store = open_store(ref.store)
    manifest = load_manifest(store, ref)
    return read_rows(shard_urls(store, ref, manifest, split)), manifest


class GlobalBatchSampler:
    def __init__(self, rows: np.ndarray, global_batch_size: int, seed: int) -> None:
        self.rows = rows
        self.global_batch_size = global_batch_size
        self.seed = seed
        self._epoch = -1
        self._order = np.empty(0, dtype=np.int64)

    def _permutation(self, epoch: int) -> np.ndarray:
        if epoch != self._epoch:
            self._order = np.random.default_rng([self.seed, epoch]).permutation(len(self.rows))
            self._epoch = epoch
        return self._order

    def global_indices(self, step: int) -> np.ndarray:
        n = len(self.rows)
        positions = np.arange(step * self.global_batch_size, (step + 1) * self.global_batch_size)
        return np.array([self._permutation(int(p // n))[p % n] for p in positions], dtype=np.int64)

    def rank_batch(self, step: int, dp_rank: int, dp_size: int) -> torch.Tensor:
        """This data-parallel rank's share of step ``step``'s global batch."""
        indices = self.global_indices(step)
        per_rank = self.global_batch_size // dp_size
        mine = indices[dp_rank * per_rank : (dp_rank + 1) * per_rank]
        return torch.from_numpy(self.rows[mine].astype(np.int64))
