"""The shipped lm-evaluation-harness tasks by name: what the config checks read (YAML only, no torch).

Their definitions are ``evaluation/lm_eval_tasks/<task>.yaml``; ``evaluation.lm_eval_suite`` builds
their data and runs them (and declares the folder as its data, so editing a YAML changes the
evaluation's cache key, not that of every task that checks settings)."""

from __future__ import annotations

from pathlib import Path

import yaml

TASKS_DIR = Path(__file__).resolve().parent / "lm_eval_tasks"
"""The shipped task definitions, one ``<task>.yaml`` each."""
METRIC_PREFIX = "lm_eval"
"""Flattened figures are named ``lm_eval.<task>.<metric>`` (EvalReport, the card, MLflow)."""
CONTINUATION_CHOICES = 4
"""Endings per heldout_continuation example: the true one and three from other documents."""
CHANCE = {
    ("heldout_continuation", "acc"): 1 / CONTINUATION_CHOICES,
    ("heldout_continuation", "acc_norm"): 1 / CONTINUATION_CHOICES,
    # Greedy decoding must produce the exact held-out word (3+ characters) among the vocabulary's.
    ("heldout_cloze", "acc"): 0.0,
}
"""What a model that guesses scores on each shipped accuracy: a figure means something only above it."""


def shipped_tasks() -> dict[str, list[str]]:
    """Every shipped task and the metrics its YAML declares (``{"heldout_cloze": ["acc", ...]}``)."""
    out = {}
    for path in sorted(TASKS_DIR.glob("*.yaml")):
        spec = yaml.safe_load(path.read_text())
        out[spec["task"]] = [m["metric"] for m in spec.get("metric_list", [])]
    return out


def metric_name(task: str, metric: str) -> str:
    return f"{METRIC_PREFIX}.{task}.{metric}"


def chance_level(name: str) -> float | None:
    """The score of guessing for the figure named ``lm_eval.<task>.<metric>`` (lm-eval's ``acc,none``
    spelling too), or None when it has none (perplexity, tasks not shipped here)."""
    parsed = parse_metric_name(name)
    return CHANCE.get((parsed[0], parsed[1].partition(",")[0])) if parsed else None


def parse_metric_name(name: str) -> tuple[str, str] | None:
    """``lm_eval.<task>.<metric>`` → (task, metric); None for any other name."""
    prefix, _, rest = name.partition(".")
    task, _, metric = rest.partition(".")
    return (task, metric) if prefix == METRIC_PREFIX and task and metric else None
