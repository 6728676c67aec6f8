"""Nothing in a checkpoint runs code: every file is checked against the digests committed with
it before anything loads, ``.metadata`` goes through an allow-list unpickler, the RNG states
load with ``weights_only=True``. Each payload is planted in a real (tiny, one-rank) checkpoint
and shown refused with a clear error, its payload never run."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import pickle
import shutil
from pathlib import Path

import pytest
import torch

from common.contracts import CHECKPOINT_DIGESTS, ENTRY_CHECKPOINT, TOKENIZER, EvalReport, checkpoint_prefix
from data_prep.errors import DataError
from evaluation.config import EvalConfig
from evaluation.evaluate import evaluate
from registry.registry import register
from storage import open_store
from tests.helpers import fresh_copy, tiny_model
from training.checkpointing import checkpoint
from training.checkpointing.checkpoint import CheckpointIntegrityError
from training.config import ParallelConfig, TrainConfig
from training.distributed import init_distributed, shutdown_distributed
from training.launch import launch
from training.model.step import build_step
from training.train import train

MODEL = tiny_model()
TP1 = ParallelConfig(tensor_parallel=1)
# Two steps, one checkpoint; a seed of its own, so that no other test shares the run id.
STEPS = TrainConfig(steps=2, micro_batch_size=2, global_batch_size=4, warmup_steps=1, checkpoint_every=2, seed=9173)
EVAL = EvalConfig(max_batches=1, batch_size=4, sample_tokens=2, prompt="def ", lm_eval_tasks=[])  # lm-eval: test_lm_eval*.py


class Payload:
    """Unpickling this calls Path.touch: proof that a pickle ran."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):
        return (Path.touch, (self.marker,))


@pytest.fixture(scope="module")
def committed(tiny_dataset, tmp_path_factory):
    """A committed one-rank checkpoint of a tiny model, in a store of its own."""
    return launch(train, 1, fresh_copy(tiny_dataset, tmp_path_factory.mktemp("checkpoint-store")), MODEL, TP1, STEPS)


@pytest.fixture
def ckpt(committed, tmp_path):
    """A private copy of the committed run and its dataset, that a test may tamper with."""
    shutil.copytree(committed.store, tmp_path / "store")
    store = str(tmp_path / "store")
    return dataclasses.replace(committed, store=store, dataset=dataclasses.replace(committed.dataset, store=store))


def folder(ref) -> Path:
    return Path(ref.store) / ref.prefix


def recorded(path: Path) -> dict:
    return json.loads((path / CHECKPOINT_DIGESTS).read_text())


def record(path: Path, rel: str) -> None:
    """What an attacker who can write the digests too would do: list ``rel``'s new sha256."""
    digests = recorded(path)
    digests["files"][rel] = hashlib.sha256((path / rel).read_bytes()).hexdigest()
    (path / CHECKPOINT_DIGESTS).write_text(json.dumps(digests))


def malicious_metadata(path: Path, marker: Path) -> bytes:
    """The checkpoint's real ``.metadata`` with a payload riding along: a plain pickle.load runs it."""
    metadata = pickle.loads((path / "model" / ".metadata").read_bytes())  # ours, trusted: the test made it
    metadata.storage_meta.modules = [Payload(marker)]
    return pickle.dumps(metadata)


@pytest.mark.slow
def test_a_committed_checkpoint_lists_every_file_and_loads(ckpt):
    digests = recorded(folder(ckpt))
    assert digests["format"] == checkpoint.DIGESTS_FORMAT
    files = sorted(p.relative_to(folder(ckpt)).as_posix() for p in folder(ckpt).rglob("*") if p.is_file())
    assert sorted(digests["files"]) == [f for f in files if f not in (CHECKPOINT_DIGESTS, "_COMMITTED")]
    assert {"model/.metadata", "model/common.pt", "model/metadata.json", "meta.json", "rng/rank-00000.pt"} <= set(files)
    for rel, digest in digests["files"].items():
        assert hashlib.sha256((folder(ckpt) / rel).read_bytes()).hexdigest() == digest, rel
    report = evaluate(ckpt, MODEL, EVAL)
    assert math.isfinite(report.val_loss)


def test_malicious_metadata_is_refused_by_its_digest(ckpt, tmp_path):
    marker = tmp_path / "payload-ran"
    (folder(ckpt) / "model" / ".metadata").write_bytes(malicious_metadata(folder(ckpt), marker))
    with pytest.raises(CheckpointIntegrityError, match=r"model/\.metadata has sha256 \w+, digests\.json records \w+"):
        evaluate(ckpt, MODEL, EVAL)
    assert not marker.exists()


def test_malicious_metadata_with_a_matching_digest_is_refused_by_the_unpickler(ckpt, tmp_path):
    marker = tmp_path / "payload-ran"
    data = malicious_metadata(folder(ckpt), marker)
    pickle.loads(data)  # the payload is real: a plain pickle.load (torch's reader) runs it
    assert marker.exists()
    marker.unlink()
    (folder(ckpt) / "model" / ".metadata").write_bytes(data)
    record(folder(ckpt), "model/.metadata")
    with pytest.raises(CheckpointIntegrityError, match=r"metadata refers to pathlib\.Path\.touch.*nothing was loaded"):
        evaluate(ckpt, MODEL, EVAL)
    assert not marker.exists()


def test_metadata_pointing_outside_its_folder_is_refused(ckpt):
    path = folder(ckpt) / "model" / ".metadata"
    metadata = pickle.loads(path.read_bytes())
    info = next(iter(metadata.storage_data.values()))
    info.relative_path = "../../meta.json"
    path.write_bytes(pickle.dumps(metadata))
    record(folder(ckpt), "model/.metadata")
    with pytest.raises(CheckpointIntegrityError, match=r"points tensor data at '\.\./\.\./meta\.json'"):
        evaluate(ckpt, MODEL, EVAL)


def resume(ref) -> dict:
    """``checkpoint.load`` as a resume does it, in this process (a world of one)."""
    meta = json.loads((folder(ref) / "meta.json").read_text())
    init_distributed(TP1, STEPS.seed, standalone=True)
    try:
        trainer = build_step(MODEL, TP1, STEPS, 384, 32)
        return checkpoint.load(open_store(ref.store), ref.prefix, trainer.model, trainer.optimizer, meta["layout"])
    finally:
        shutdown_distributed()


def test_the_rng_state_loads_as_data_and_resumes(ckpt):
    state = checkpoint.load_rng_state(folder(ckpt) / "rng" / "rank-00000.pt")
    assert isinstance(state["torch"], torch.Tensor) and isinstance(state["numpy"]["keys"], torch.Tensor)
    assert resume(ckpt)["step"] == STEPS.steps


def test_malicious_rng_file_is_refused_by_its_digest(ckpt, tmp_path):
    marker = tmp_path / "payload-ran"
    torch.save({"torch": Payload(marker)}, folder(ckpt) / "rng" / "rank-00000.pt")
    with pytest.raises(CheckpointIntegrityError, match=r"rng/rank-00000\.pt has sha256 \w+, digests\.json records"):
        resume(ckpt)
    assert not marker.exists()


def test_malicious_rng_file_with_a_matching_digest_is_refused_by_weights_only(ckpt, tmp_path):
    marker = tmp_path / "payload-ran"
    torch.save({"torch": Payload(marker)}, folder(ckpt) / "rng" / "rank-00000.pt")
    record(folder(ckpt), "rng/rank-00000.pt")
    with pytest.raises(CheckpointIntegrityError, match=r"rank-00000\.pt is not RNG state saved by this release \(it refers to "):
        resume(ckpt)
    assert not marker.exists()


def test_a_tampered_weight_file_is_refused(ckpt):
    weights = folder(ckpt) / "model" / "__0_0.distcp"
    data = bytearray(weights.read_bytes())
    data[len(data) // 2] ^= 0xFF  # same size, one byte of one tensor changed
    weights.write_bytes(bytes(data))
    with pytest.raises(CheckpointIntegrityError, match=r"not the one committed: model/__0_0\.distcp has sha256"):
        evaluate(ckpt, MODEL, EVAL)


def test_an_unlisted_or_missing_file_is_refused(ckpt, tmp_path):
    (folder(ckpt) / "model" / "extra.pt").write_bytes(b"planted")
    with pytest.raises(CheckpointIntegrityError, match=r"model/extra\.pt is not listed in digests\.json"):
        checkpoint.fetch(open_store(ckpt.store), ckpt.prefix, tmp_path / "one")
    (folder(ckpt) / "model" / "extra.pt").unlink()
    (folder(ckpt) / "model" / "common.pt").unlink()
    with pytest.raises(CheckpointIntegrityError, match=r"model/common\.pt is missing"):
        checkpoint.fetch(open_store(ckpt.store), ckpt.prefix, tmp_path / "two")
    (folder(ckpt) / CHECKPOINT_DIGESTS).unlink()
    with pytest.raises(CheckpointIntegrityError, match=r"has no digests\.json"):
        checkpoint.fetch(open_store(ckpt.store), ckpt.prefix, tmp_path / "three")


def test_registered_copy_carries_its_digests_for_continued_pretraining_and_the_gate(ckpt, tmp_path):
    store = open_store(ckpt.store)
    report = EvalReport(ckpt, 3.0, math.exp(3.0), 100, 3.0 / math.log(2), sample="def f():")
    entry = register(store, "safety", report, config={"model": dataclasses.asdict(MODEL)}).prefix
    copy = Path(ckpt.store) / entry / ENTRY_CHECKPOINT
    listed = recorded(copy)["files"]
    files = [p.relative_to(copy).as_posix() for p in copy.rglob("*") if p.is_file()]
    assert sorted(listed) == sorted(f for f in files if f != CHECKPOINT_DIGESTS)
    assert "rng/rank-00000.pt" not in listed  # the entry keeps the weights and meta only
    assert listed["model/.metadata"] == recorded(folder(ckpt))["files"]["model/.metadata"]
    # The gate's baseline: the entry loads, then refuses once one of its files is changed. The candidate
    # is another checkpoint (a copy): the entry's own checkpoint is no baseline for itself (evaluate.baseline_for).
    other = dataclasses.replace(ckpt, prefix=checkpoint_prefix(ckpt.run, 1), step=1)
    shutil.copytree(folder(ckpt), folder(other))
    assert 0 < evaluate(other, MODEL, EVAL, baseline=entry).baseline_bits_per_byte < math.inf  # -1: not loaded
    marker = tmp_path / "payload-ran"
    (copy / "model" / ".metadata").write_bytes(malicious_metadata(copy, marker))
    with pytest.raises(CheckpointIntegrityError, match=rf"{ENTRY_CHECKPOINT} is not the one committed: model/\.metadata"):
        evaluate(other, MODEL, EVAL, baseline=entry)
    # Continued pretraining from the entry: load_weights checks the same way.
    init_distributed(TP1, STEPS.seed, standalone=True)
    try:
        model = build_step(MODEL, TP1, STEPS, 384, 32).model
        with pytest.raises(CheckpointIntegrityError, match=r"model/\.metadata has sha256"):
            checkpoint.load_weights(store, f"{entry}/{ENTRY_CHECKPOINT}", model, committed_at=entry)
    finally:
        shutdown_distributed()
    assert not marker.exists()


def test_evaluation_refuses_a_tampered_validation_shard(ckpt):
    shard = Path(ckpt.dataset.store) / ckpt.dataset.prefix / "shards" / "val-000000.tar"
    data = bytearray(shard.read_bytes())
    data[len(data) // 2] ^= 0x01
    shard.write_bytes(bytes(data))
    with pytest.raises(DataError, match=r"val-000000\.tar: sha256 \w+, the manifest records \w+: the dataset was modified"):
        evaluate(ckpt, MODEL, EVAL)


def test_a_tokenizer_changed_after_the_dataset_commit_is_neither_evaluated_nor_registered(ckpt):
    """Issue 50 finding 3: evaluation, its Hugging Face export and registration read the dataset's
    ``tokenizer.json`` without comparing it with the manifest's ``tokenizer.sha256``: a writer to ``datasets/``
    who overwrote it chose the tokenizer of every model registered from that dataset afterwards."""
    store = open_store(ckpt.store)
    key = f"{ckpt.dataset.prefix}/{TOKENIZER}"
    store.put_bytes(key, store.get_bytes(key) + b"\n")  # still a valid tokenizer: only the digest tells
    changed = rf"{TOKENIZER} has sha256 \w+…, not the \w+… its manifest records: it was changed after dataset"
    with pytest.raises(DataError, match=changed):
        evaluate(ckpt, MODEL, EVAL)
    report = EvalReport(ckpt, 3.0, math.exp(3.0), 100, 3.0 / math.log(2), sample="def f():")
    with pytest.raises(DataError, match=changed):
        register(store, "swapped", report)
    assert not [k for k in store.list("models/") if k.endswith("_COMMITTED")]  # no entry visible
