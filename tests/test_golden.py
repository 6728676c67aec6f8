"""Golden loss curve of the tiny preset: the preset's model, tensor-parallel layout and
optimiser, 20 steps on a generated corpus (no dependence on the interpreter's stdlib), two
real gloo ranks. Any change to the data path, the model, the step or the schedule that moves
the numbers shows here; if it is intended, regenerate the file and say why in the commit:

    PRETRAIN_UPDATE_GOLDEN=1 .venv/bin/pytest tests/test_golden.py
"""

import dataclasses
import json
import os
from pathlib import Path

import pytest

from data_prep.prepare import prepare_dataset
from pipeline.config import load_config
from storage import open_store
from tests.helpers import distinct_docs, write_corpus
from training.launch import launch
from training.train import train

ROOT = Path(__file__).resolve().parent.parent
GOLDEN = Path(__file__).parent / "golden" / "tiny_cpu_loss.json"
# Identical run to run on one machine; another CPU may sum in another order (fp32).
TOLERANCE = 1e-3

pytestmark = pytest.mark.slow


def test_tiny_preset_matches_its_golden_loss_curve(tmp_path, monkeypatch):
    preset = load_config(ROOT / "configs" / "tiny-cpu.yaml")
    write_corpus(tmp_path / "corpus", {f"doc{i}.txt": text for i, text in enumerate(distinct_docs(300, seed=7))})
    # A relative source: the dataset version (which seeds the sample order) names the listing.
    monkeypatch.chdir(tmp_path)
    data = dataclasses.replace(preset.data, sources=["corpus"], workers=2)
    dataset = prepare_dataset(data, preset.tokenizer, open_store(str(tmp_path / "store")))
    train_cfg = dataclasses.replace(preset.train, steps=20, warmup_steps=5, checkpoint_every=20)
    ref = launch(train, 2, dataset, preset.model, preset.parallel, train_cfg)
    lines = open_store(ref.store).get_bytes(f"{ref.run}/metrics.jsonl").decode().splitlines()
    losses = [round(json.loads(line)["loss"], 6) for line in lines]

    if os.environ.get("PRETRAIN_UPDATE_GOLDEN") == "1":
        GOLDEN.parent.mkdir(exist_ok=True)
        record = {"steps": len(losses), "dataset_version": dataset.version, "loss": losses}
        GOLDEN.write_text(json.dumps(record, indent=1) + "\n")
    assert GOLDEN.exists(), f"{GOLDEN} is missing: generate it as the module docstring says"
    golden = json.loads(GOLDEN.read_text())
    assert dataset.version == golden["dataset_version"], "the data path changed: see the module docstring"
    assert len(losses) == golden["steps"] == 20
    assert losses == pytest.approx(golden["loss"], abs=TOLERANCE)
    assert losses[-1] < losses[0] - 1.0  # and it learns
