"""The pipeline config as MLflow params: one flat ``section.key`` name per setting."""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping
from typing import Any

from common.redact import redact
from common.settings import flat_settings

MAX_PARAM_VALUE = 6000
"""MLflow's limit on a param value's length (characters)."""
MAX_PARAMS_PER_BATCH = 100
"""MLflow's limit on params in one log_batch request."""
TRUNCATED = "…(truncated)"


def flatten(config: Mapping[str, Any], prefix: str = "") -> dict[str, str]:
    """``{"train": {"lr": 0.002}}`` → ``{"train.lr": "0.002"}``: nested mappings become dotted names,
    every other value its text (lists and other containers as JSON), credentials in URIs left out
    (``common.redact``); a value longer than MLflow
    takes is cut to fit and says so. Keys come out sorted, so equal configs give equal params."""
    out: dict[str, str] = {}
    for name, value in sorted(_by_name(flat_settings(config, prefix)).items()):
        text = redact(value if isinstance(value, str) else json.dumps(value, sort_keys=True, default=str))
        if len(text) > MAX_PARAM_VALUE:
            text = text[: MAX_PARAM_VALUE - len(TRUNCATED)] + TRUNCATED
        out[name] = text
    return out


def batches(params: Mapping[str, str], size: int = MAX_PARAMS_PER_BATCH) -> Iterator[dict[str, str]]:
    """``params`` in chunks MLflow accepts in one request."""
    items = list(params.items())
    for start in range(0, len(items), size):
        yield dict(items[start : start + size])


def _by_name(flat: dict[str, Any]) -> dict[str, Any]:
    """A list of named sections (``data.mixture``) as one param per set key of each: ``data.mixture.code.weight``,
    so that MLflow compares two runs' weights key by key (one JSON value would also outgrow a param)."""
    out: dict[str, Any] = {}
    for name, value in flat.items():
        if isinstance(value, list) and value and all(isinstance(v, dict) and isinstance(v.get("name"), str) for v in value):
            for item in value:
                out |= {f"{name}.{item['name']}.{k}": v for k, v in item.items() if k != "name" and v is not None}
        else:
            out[name] = value
    return out
