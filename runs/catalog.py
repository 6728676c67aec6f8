"""The training runs in a store, for ``pretrain runs list`` and ``pretrain runs compare``: finding a run by its id
or a unique prefix of it (``resolve_run``), the views of every run (``list_runs``), and runs side by side
(``compare``: the settings that differ and each run's figures). One run's view is ``runs.view``. Torch-free.
"""

from __future__ import annotations

from typing import Any

from common.errors import UserError
from common.settings import flat_settings
from runs.reading import load_run
from runs.view import RunView, layout_short, layouts_of
from storage import Store

RUNS = "runs"
SHORT_ID = 12
"""Characters of a run id or dataset version shown in a listing."""


class RunNotFound(UserError, LookupError):
    """No run, or more than one, matches the id or prefix given."""


# -- finding runs ---------------------------------------------------------------------------
def run_ids(store: Store) -> list[str]:
    """The ids of every run in the store, sorted."""
    return store.children(RUNS)


def resolve_run(store: Store, text: str) -> str:
    """The id of the run ``text`` names: its id, ``runs/<id>``, or a prefix of the id matching one run only."""
    wanted = text.strip().removeprefix(f"{RUNS}/").rstrip("/")
    ids = run_ids(store)
    if wanted in ids:
        return wanted
    matches = [i for i in ids if wanted and i.startswith(wanted)]
    if len(matches) == 1:
        return matches[0]
    if matches:
        raise RunNotFound(
            f"run {text!r} is ambiguous in {store.uri}: {len(matches)} runs start with it ({_names(matches)}); "
            "give more characters of the id"
        )
    known = f"runs there: {_names(ids)}" if ids else "it holds no runs"
    raise RunNotFound(f"no run {text!r} in {store.uri} ({known}); `pretrain runs list --store {store.uri}` lists them")


def _names(ids: list[str], most: int = 8) -> str:
    shown = ", ".join(ids[:most])
    return f"{shown} and {len(ids) - most} more" if len(ids) > most else shown


# -- every run, several runs side by side ------------------------------------------------------
def list_runs(store: Store) -> list[RunView]:
    """Every run's view (without the details only ``runs show`` prints), the most recently changed first (runs
    whose time is unknown last, by id)."""
    views = [load_run(store, run_id, detail=False) for run_id in run_ids(store)]
    return sorted(views, key=lambda v: (v.modified is None, -(v.modified or 0.0), v.id))


def load_runs(store: Store, texts: list[str]) -> list[RunView]:
    """The views of the runs ``texts`` name (ids or unique prefixes), each named once."""
    ids = [resolve_run(store, text) for text in texts]
    twice = sorted({i for i in ids if ids.count(i) > 1})
    if twice:
        raise UserError(f"run {twice[0]} is named more than once ({', '.join(texts)}); name each run to compare once")
    return [load_run(store, run_id) for run_id in ids]


def flat_config(meta: dict) -> dict[str, Any]:
    """The settings a run was trained with, flattened to ``section.key`` (``train.lr``, ``model.num_layers``),
    plus ``dataset`` (its version), a mixture's ``mixture.<component>.weight`` and ``layouts`` (which layout
    trained which steps), from its latest checkpoint's meta.json; {} for a run with no committed checkpoint."""
    flat: dict[str, Any] = {}
    if meta.get("dataset") is not None:
        flat["dataset"] = meta["dataset"]
    for name, weight in (meta.get("mixture") or {}).items():  # a mixture's weights: what research changes most
        flat[f"mixture.{name}.weight"] = weight
    for section in ("model", "train"):
        flat.update(flat_settings(meta.get(section) or {}, f"{section}."))
    layouts = layouts_of(meta)
    if layouts:
        flat["layouts"] = "; ".join(f"{s['first_step']}-{s['last_step']} {layout_short(s)}" for s in layouts)
    return flat


def differences(configs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The keys whose value is not the same in every config (a key some lack counts as differing, the missing
    value None), sorted: ``[{"key": "train.lr", "values": [0.003, 0.001]}, ...]``."""
    keys = sorted(set().union(*configs)) if configs else []
    out = []
    for key in keys:
        values = [config.get(key) for config in configs]
        if any(v != values[0] for v in values[1:]):
            out.append({"key": key, "values": values})
    return out


def compare(views: list[RunView]) -> dict[str, Any]:
    """What ``pretrain runs compare`` prints of runs side by side: the config keys that differ between them and
    each run's figures (final train loss, the latest evaluation's validation loss, perplexity and bits per byte,
    median tokens/s and MFU, steps)."""
    configs = [flat_config(view.meta) for view in views]
    runs = []
    for view in views:
        evaluation = view.latest_evaluation
        runs.append(
            {
                "id": view.id,
                "uri": view.uri,
                "steps_done": view.steps_done,
                "steps_planned": view.steps_planned,
                "final_loss": view.final_loss,
                "final_loss_steps": view.final_loss_steps,
                "val_loss": evaluation.get("val_loss"),
                "perplexity": evaluation.get("perplexity"),
                "bits_per_byte": evaluation.get("bits_per_byte"),
                "eval_step": evaluation.get("step"),
                "eval_uri": evaluation.get("uri"),
                "tokens_per_s": view.tokens_per_s,
                "mfu": view.mfu,
            }
        )
    return {"runs": runs, "keys_compared": len(set().union(*configs)), "differences": differences(configs)}
