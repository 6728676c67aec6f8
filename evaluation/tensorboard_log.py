"""An evaluation's figures in the run's TensorBoard, beside the training's per-step scalars.

The training loop writes its periodic held-out points as ``heldout/loss`` (``training.validator``); the
evaluation of a committed checkpoint writes its own figures, on more rows: ``eval/loss``, ``eval/perplexity``
and ``eval/bits_per_byte`` at the checkpoint's step,
and the run's hparams (TensorBoard's HParams tab): the flattened model and train settings
(``runs.catalog.flat_config``, as ``pretrain runs compare`` compares them) with the final figures as
its metrics, ``final/train_loss`` (mean of the last applied steps), ``final/tokens_per_s`` and ``final/mfu``
(medians) and the ``eval/*`` scalars. One event file per evaluation, named after it
(``<run>/tensorboard/events.out.tfevents.eval-<key>``): a rerun of the same evaluation replaces its file
instead of adding a twin. Nothing is written for a run trained with ``train.tensorboard: false``.
"""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any

from common.contracts import CHECKPOINT_META, CheckpointRef, tensorboard_prefix
from common.settings import value_text
from runs import catalog
from runs.reading import load_run
from storage import Store

VALIDATION_TAGS = {"val_loss": "eval/loss", "perplexity": "eval/perplexity", "bits_per_byte": "eval/bits_per_byte"}
"""The evaluation's figure → its scalar's tag."""
FINAL_TAGS = {"final_loss": "final/train_loss", "tokens_per_s": "final/tokens_per_s", "mfu": "final/mfu"}
"""``RunView.summary``'s figure of the run → its scalar's tag."""


def event_file(run: str, key: str) -> str:
    """Where the evaluation ``key`` of the run at ``run`` (``runs/<id>``) writes its event file."""
    return f"{tensorboard_prefix(run)}/events.out.tfevents.eval-{key}"


def log_evaluation(store: Store, ckpt: CheckpointRef, figures: dict[str, float], key: str) -> str | None:
    """Write the evaluation ``key``'s figures (``val_loss``, ``perplexity``, ``bits_per_byte``) at ``ckpt``'s
    step and the run's hparams to the run's TensorBoard folder; the event file's key, or None when the run
    keeps no TensorBoard."""
    meta = store.get_json(f"{ckpt.prefix}/{CHECKPOINT_META}")
    if not (meta.get("train") or {}).get("tensorboard", True):
        return None
    from torch.utils.tensorboard import SummaryWriter
    from torch.utils.tensorboard.summary import hparams

    scalars = {tag: float(figures[name]) for name, tag in VALIDATION_TAGS.items() if figures.get(name) is not None}
    final = load_run(store, ckpt.run.removeprefix(f"{catalog.RUNS}/"), detail=False).summary()
    scalars |= {tag: float(final[name]) for name, tag in FINAL_TAGS.items() if final.get(name) is not None}
    settings = {name: _hparam(value) for name, value in catalog.flat_config(meta).items() if value is not None}
    destination = event_file(ckpt.run, key)
    with tempfile.TemporaryDirectory(prefix="pretrain-eval-tb-") as tmp:
        writer = SummaryWriter(tmp)
        for tag, value in scalars.items():
            writer.add_scalar(tag, value, ckpt.step)
        # The HParams plugin's three summaries, in this run's own folder (SummaryWriter.add_hparams would
        # make a sub-run): the metrics it lists are the scalars above, read from this folder.
        for summary in hparams(settings, dict.fromkeys(scalars, 0.0)):
            writer.file_writer.add_summary(summary, ckpt.step)
        writer.close()
        (written,) = Path(tmp).iterdir()
        store.put_file(destination, written)
    return destination


def _hparam(value: Any) -> bool | int | float | str:
    """A setting as TensorBoard takes it: a number, a bool or a string (lists and mappings as JSON)."""
    return value if isinstance(value, (bool, int, float, str)) else value_text(value)
