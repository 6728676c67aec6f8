"""A committed checkpoint's tensors as one flat ``{key: Tensor}``, read in one process.

Used to compare two runs bit for bit (the soak benchmark, the same-bytes test): every tensor
of ``model/`` (weights, and the optimizer's moments saved beside them as ``optimizer.state.*``),
whatever the parallel layout that wrote it, with torch DCP's no-distributed load of the
whole checkpoint.

It reads what ``training.checkpointing.checkpoint`` reads, as safely: the checkpoint is downloaded with
``checkpoint.fetch`` (committed, every file's sha256 checked against ``digests.json``), the
``.metadata`` pickle goes through the allow-list unpickler, and byte items load with
``weights_only=True``.
"""

from __future__ import annotations

import io
import tempfile
from pathlib import Path

import torch

from common.contracts import CHECKPOINT_MODEL
from storage import Store
from training.checkpointing.checkpoint import fetch, load_bytes_as_data, metadata_to_load


def _reader_and_planner(folder: Path):
    from torch.distributed.checkpoint import FileSystemReader
    from torch.distributed.checkpoint.default_planner import _EmptyStateDictLoadPlanner

    class Reader(FileSystemReader):
        """torch's reader unpickles ``.metadata`` with plain ``pickle``: ours allows data classes only."""

        def read_metadata(self, *args, **kwargs):
            return metadata_to_load(Path(self.path) / ".metadata", self.load_id)

    class Planner(_EmptyStateDictLoadPlanner):
        """Loads every item the checkpoint holds; byte items (sharded objects) as data only."""

        def load_bytes(self, read_item, value: io.BytesIO) -> None:
            load_bytes_as_data(self, read_item, value)

    return Reader(str(folder)), Planner()


def load_tensors(folder: Path) -> dict[str, torch.Tensor]:
    """Every tensor of a fetched checkpoint folder's ``model/``, keyed by its DCP name (non-tensor
    items, e.g. megatron's ``_extra_state`` objects, are left out)."""
    from torch.distributed.checkpoint.state_dict_loader import _load_state_dict

    reader, planner = _reader_and_planner(folder / CHECKPOINT_MODEL)
    state: dict = {}
    # The private loader, as torch's own dcp_to_torch_save does: the public ``load`` fills a copy
    # of the (empty) dict it is given, which the planner's rebuilt state never reaches.
    _load_state_dict(state, storage_reader=reader, planner=planner, no_dist=True)
    flat: dict[str, torch.Tensor] = {}

    def walk(prefix: str, value) -> None:
        if isinstance(value, torch.Tensor):
            flat[prefix] = value
        elif isinstance(value, dict):
            for key, item in value.items():
                walk(f"{prefix}.{key}" if prefix else str(key), item)

    walk("", state)
    return flat


def checkpoint_tensors(store: Store, prefix: str, committed_at: str | None = None) -> dict[str, torch.Tensor]:
    """The tensors of the committed checkpoint at ``prefix`` in ``store`` (``committed_at``: an
    enclosing committed prefix, e.g. a registry entry, as ``checkpoint.fetch`` takes)."""
    with tempfile.TemporaryDirectory(prefix="pretrain-snapshot-") as tmp:
        folder = fetch(store, prefix, Path(tmp) / "ckpt", committed_at=committed_at)
        return load_tensors(folder)


def differences(expected: dict[str, torch.Tensor], actual: dict[str, torch.Tensor]) -> list[str]:
    """What differs between two checkpoints' tensors: keys on one side only, and every key whose
    tensors are not bitwise equal (dtype, shape and every element: ``torch.equal``). Empty: identical."""
    problems = [f"only in the first: {key}" for key in sorted(expected.keys() - actual.keys())]
    problems += [f"only in the second: {key}" for key in sorted(actual.keys() - expected.keys())]
    for key in sorted(expected.keys() & actual.keys()):
        a, b = expected[key], actual[key]
        if a.dtype != b.dtype or a.shape != b.shape:
            problems.append(f"{key}: {a.dtype}{tuple(a.shape)} vs {b.dtype}{tuple(b.shape)}")
        elif not torch.equal(a, b):
            problems.append(f"{key}: values differ (max abs difference {(a.double() - b.double()).abs().max().item():.3g})")
    return problems


# A model card's metrics that measure speed, not what was computed: they differ between any two
# runs of the same inputs (machine load), so a comparison of runs leaves them out.
TIMING_METRICS = frozenset({"tokens_per_second", "mfu", "compile_s"})


def comparable_metrics(metrics: dict) -> dict:
    """A card's metrics less the timing ones (``TIMING_METRICS``)."""
    return {key: value for key, value in metrics.items() if key not in TIMING_METRICS}
