"""Golden loss curve of the tiny preset: the preset's model, tensor-parallel layout and
optimiser, 20 steps on a generated corpus (no dependence on the interpreter's stdlib), two
real gloo ranks. Any change to the data path, the model, the step or the schedule that moves
the numbers shows here; if it is intended, regenerate the file and say why in the commit:

    PRETRAIN_UPDATE_GOLDEN=1 .venv/bin/pytest tests/test_golden.py

That run rewrites the file and then fails on purpose, saying what changed against the file it
replaced: a rewritten golden file is reviewed and committed, never a passing test. Run the test
again without the variable to check the new file.
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


def changes(previous: dict | None, record: dict) -> str:
    """What a rewrite of the golden file changes, in words."""
    if previous is None:
        return "there was none"
    notes = []
    if previous.get("dataset_version") != record["dataset_version"]:
        notes.append(f"dataset version {previous.get('dataset_version')} -> {record['dataset_version']}")
    if previous.get("steps") != record["steps"]:
        notes.append(f"steps {previous.get('steps')} -> {record['steps']}")
    pairs = list(zip(previous.get("loss", []), record["loss"], strict=False))
    moved = [abs(new - old) for old, new in pairs]
    if moved:
        at = max(range(len(moved)), key=moved.__getitem__)
        beyond = sum(m > TOLERANCE for m in moved)
        notes.append(
            f"largest loss change {moved[at]:.6f} at step {at + 1} ({pairs[at][0]:.6f} -> {pairs[at][1]:.6f}), "
            f"{beyond} of {len(moved)} steps beyond the tolerance {TOLERANCE}"
        )
    return "; ".join(notes)


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
        assert curve[-1] < curve[0] - 1.0, f"the new curve does not learn: {GOLDEN} not rewritten ({curve})"
        record = {"steps": len(curve), "dataset_version": dataset.version, "loss": curve}
        previous = json.loads(GOLDEN.read_text()) if GOLDEN.exists() else None
        GOLDEN.parent.mkdir(exist_ok=True)
        GOLDEN.write_text(json.dumps(record, indent=1) + "\n")
        pytest.fail(
            f"PRETRAIN_UPDATE_GOLDEN=1 rewrote {GOLDEN}; against the file it replaced: {changes(previous, record)}. "
            "Nothing was tested: review the new file (git diff), commit it saying why the numbers moved, "
            "and run the test again without PRETRAIN_UPDATE_GOLDEN.",
            pytrace=False,
        )
    assert GOLDEN.exists(), f"{GOLDEN} is missing: generate it as the module docstring says"
    golden = json.loads(GOLDEN.read_text())
    assert dataset.version == golden["dataset_version"], "the data path changed: see the module docstring"
    assert len(curve) == golden["steps"] == 20
    assert curve == pytest.approx(golden["loss"], abs=TOLERANCE)
    assert curve[-1] < curve[0] - 1.0  # and it learns
