"""A mixture's validation split, component by component: each is scored on its own rows.

A blend's validation shards are listed component after component (``data_prep.blend_dataset``), so the
split's rows cut into the components' by their ``val_sequences``. Each component gets up to
``evaluation.max_batches`` batches of its own (a cap over the whole split would score the first
component alone); the overall figure is over every scored row, as for a plain dataset.
"""

from __future__ import annotations

import math

import numpy as np

from evaluation.config import EvalConfig


def component_rows(manifest: dict, rows: np.ndarray, cfg: EvalConfig) -> dict[str, np.ndarray]:
    """Each component's validation rows (at most ``max_batches × batch_size``), by name; {} for a plain dataset."""
    mixture = manifest.get("mixture") or []
    if len(mixture) < 2:
        return {}
    counts = [int(m["val_sequences"]) for m in mixture]
    if sum(counts) != len(rows):
        raise ValueError(f"the mixture's validation split holds {len(rows)} rows, its components {counts}")
    cap = cfg.max_batches * cfg.batch_size if cfg.max_batches else None
    starts = np.cumsum([0, *counts])
    return {m["name"]: rows[starts[i] : starts[i + 1]][:cap] for i, m in enumerate(mixture)}


def component_figures(manifest: dict, losses: dict[str, float]) -> dict[str, dict[str, float]]:
    """``val_loss`` and ``bits_per_byte`` of each component, with its own tokens per byte."""
    stats = {m["name"]: m["stats"] for m in manifest["mixture"]}
    return {
        name: {"val_loss": loss, "bits_per_byte": loss / math.log(2) * stats[name]["val_doc_tokens"] / stats[name]["val_bytes"]}
        for name, loss in losses.items()
    }
