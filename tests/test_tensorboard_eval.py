"""An evaluation's figures in the run's TensorBoard (``evaluation.tensorboard_log``): ``eval/*`` scalars at the
evaluated step and the run's hparams (its flattened settings, the final figures as metrics), read back from
the event files with TensorBoard's own EventAccumulator. The run's files are written as training writes them:
no model is trained here (``tests/test_training.py`` checks that a real evaluation writes the file)."""

from __future__ import annotations

import statistics
from dataclasses import asdict, replace

import pytest

from common.contracts import CHECKPOINT_META, CheckpointRef, DatasetRef, checkpoint_prefix, metrics_key, tensorboard_prefix
from evaluation.tensorboard_log import event_file, log_evaluation
from runs.records import jsonl
from storage import open_store
from tests.helpers import tiny_model
from training.config import TrainConfig

RUN = "runs/r1"
STEP = 8
TRAIN = TrainConfig(steps=STEP, micro_batch_size=4, global_batch_size=8, lr=3e-3)
FIGURES = {"val_loss": 4.5, "perplexity": 90.0171313, "bits_per_byte": 1.75}


def a_run(tmp_path, train: TrainConfig = TRAIN):
    """A run's files as training leaves them (metrics, the checkpoint's meta.json) and its CheckpointRef."""
    store = open_store(str(tmp_path / "store"))
    records = [{"step": s, "loss": 6.0 - s / 4, "tokens_per_s": 900.0 + s, "mfu": 0.3 + s / 100} for s in range(1, STEP + 1)]
    store.put_bytes(metrics_key(RUN), jsonl(records))
    meta = {"step": STEP, "dataset": "d1", "model": asdict(tiny_model()), "train": asdict(train)}
    store.put_json(f"{checkpoint_prefix(RUN, STEP)}/{CHECKPOINT_META}", meta)
    dataset = DatasetRef(store=store.uri, version="d1", prefix="datasets/d1", stats={})
    return store, CheckpointRef(store.uri, RUN, checkpoint_prefix(RUN, STEP), STEP, dataset), records


def test_validation_figures_and_hparams_are_in_the_runs_tensorboard(tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    from tensorboard.plugins.hparams import plugin_data_pb2

    store, ckpt, records = a_run(tmp_path)
    written = log_evaluation(store, ckpt, FIGURES, "k1")
    assert written == event_file(RUN, "k1") == f"{tensorboard_prefix(RUN)}/events.out.tfevents.eval-k1"
    assert log_evaluation(store, ckpt, {**FIGURES, "val_loss": 4.4}, "k1") == written  # a rerun replaces its file
    assert store.list(f"{tensorboard_prefix(RUN)}/") == [written]

    events = EventAccumulator(str(store.download_dir(tensorboard_prefix(RUN), tmp_path / "tb"))).Reload()
    scalars = {tag: [(e.step, e.value) for e in events.Scalars(tag)] for tag in events.Tags()["scalars"]}
    assert scalars["eval/loss"] == [(STEP, pytest.approx(4.4))]  # TensorBoard stores float32
    assert scalars["eval/perplexity"] == [(STEP, pytest.approx(90.0171313))]
    assert scalars["eval/bits_per_byte"] == [(STEP, pytest.approx(1.75))]
    losses = [r["loss"] for r in records]
    assert scalars["final/train_loss"] == [(STEP, pytest.approx(sum(losses) / len(losses)))]
    assert scalars["final/tokens_per_s"] == [(STEP, pytest.approx(statistics.median_high(r["tokens_per_s"] for r in records)))]
    assert scalars["final/mfu"] == [(STEP, pytest.approx(statistics.median_high(r["mfu"] for r in records)))]

    content = events.PluginTagToContent("hparams")
    experiment = plugin_data_pb2.HParamsPluginData.FromString(content["_hparams_/experiment"]).experiment
    assert {m.name.tag for m in experiment.metric_infos} == set(scalars)  # the HParams tab's metric columns
    session = plugin_data_pb2.HParamsPluginData.FromString(content["_hparams_/session_start_info"]).session_start_info
    assert session.hparams["train.lr"].number_value == pytest.approx(3e-3)
    assert session.hparams["model.num_layers"].number_value == tiny_model().num_layers
    assert session.hparams["train.on_bad_loss"].string_value == TRAIN.on_bad_loss
    assert session.hparams["dataset"].string_value == "d1"


def test_a_run_without_tensorboard_gets_no_event_file(tmp_path):
    store, ckpt, _ = a_run(tmp_path, replace(TRAIN, tensorboard=False))
    assert log_evaluation(store, ckpt, FIGURES, "k1") is None
    assert store.list(f"{tensorboard_prefix(RUN)}/") == []
