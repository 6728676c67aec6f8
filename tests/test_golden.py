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
from tests.helpers import ROOT, distinct_docs, losses, write_corpus
from training.launch import launch
from training.train import train

GOLDEN = Path(__file__).parent / "golden" / "tiny_cpu_loss.json"
# Identical run to run on one machine; another CPU may sum in another order (fp32).
TOLERANCE = 1e-3

pytestmark = pytest.mark.slow


def test_tiny_preset_matches_its_golden_loss_curve(tmp_path):
    preset = load_config(ROOT / "configs" / "tiny-cpu.yaml")
    corpus = write_corpus(tmp_path / "corpus", {f"doc{i}.txt": text for i, text in enumerate(distinct_docs(300, seed=7))})
    # The dataset version (which seeds the sample order) does not depend on where the corpus is.
    data = dataclasses.replace(preset.data, sources=[str(corpus)], workers=2)
    dataset = prepare_dataset(data, preset.tokenizer, open_store(str(tmp_path / "store")))
    train_cfg = dataclasses.replace(preset.train, steps=20, warmup_steps=5, checkpoint_every=20)
    ref = launch(train, 2, dataset, preset.model, preset.parallel, train_cfg)
    curve = [round(loss, 6) for loss in losses(ref)]

    if os.environ.get("PRETRAIN_UPDATE_GOLDEN") == "1":
        GOLDEN.parent.mkdir(exist_ok=True)
        record = {"steps": len(curve), "dataset_version": dataset.version, "loss": curve}
        GOLDEN.write_text(json.dumps(record, indent=1) + "\n")
    assert GOLDEN.exists(), f"{GOLDEN} is missing: generate it as the module docstring says"
    golden = json.loads(GOLDEN.read_text())
    assert dataset.version == golden["dataset_version"], "the data path changed: see the module docstring"
    assert len(curve) == golden["steps"] == 20
    assert curve == pytest.approx(golden["loss"], abs=TOLERANCE)
    assert curve[-1] < curve[0] - 1.0  # and it learns
