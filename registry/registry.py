"""A model registry on the object store: immutable versions, lineage, aliases.

``models/<name>/<version>/`` holds ``card.json``, ``card.md``, the checkpoint (model
weights and meta), the tokenizer and, when the evaluation produced them, its
``evaluation.json`` and the Hugging Face export ``hf/`` (``from_pretrained`` loads it).
A version is first *claimed* with a conditional create, so concurrent registrations
never write into the same directory; it becomes visible only when ``_COMMITTED`` is
written last. ``models/<name>/aliases/<alias>.json``
points at a version and is replaced in a single write.
"""

from __future__ import annotations

import datetime as dt
import subprocess
import tempfile
from pathlib import Path
from typing import Any

from common.contracts import EVAL_RESULTS, HF_EXPORT, MANIFEST, TOKENIZER, ModelRef
from common.errors import UserError
from storage import AlreadyCommitted, Store, StoreError

CLAIM = "_CLAIMED"


class RegistryError(UserError, LookupError):
    """A model or version that does not exist, or a registration that cannot proceed."""


def _versions(store: Store, name: str, committed_only: bool = True) -> list[int]:
    found = []
    for child in store.children(f"models/{name}"):
        if child.isdigit() and (not committed_only or store.is_committed(f"models/{name}/{child}")):
            found.append(int(child))
    return sorted(found)


def _claim_version(store: Store, name: str) -> int:
    version = (_versions(store, name, committed_only=False) or [0])[-1] + 1
    while True:
        try:
            store.put_json(f"models/{name}/{version}/{CLAIM}", {"claimed": _now()}, if_absent=True)
            return version
        except AlreadyCommitted:
            version += 1


def _now() -> str:
    return dt.datetime.now(dt.UTC).isoformat(timespec="seconds")


def code_revision() -> dict[str, Any]:
    """The git commit of the project and whether its tree had uncommitted changes."""
    root = Path(__file__).resolve().parent.parent
    try:
        commit = subprocess.run(["git", "rev-parse", "HEAD"], cwd=root, capture_output=True, text=True, check=True).stdout.strip()
        dirty = bool(subprocess.run(["git", "status", "--porcelain"], cwd=root, capture_output=True, text=True).stdout.strip())
        return {"commit": commit, "dirty": dirty}
    except (OSError, subprocess.CalledProcessError):
        return {"commit": "unknown", "dirty": None}


def register(
    store: Store,
    name: str,
    checkpoint_prefix: str,
    dataset_prefix: str,
    card: dict[str, Any],
    aliases: tuple[str, ...] = ("latest",),
    evaluation_prefix: str = "",
) -> ModelRef:
    """Copy the checkpoint, tokenizer and evaluation outputs into a new version, write its
    card, commit, move aliases."""
    for needed in filter(None, (checkpoint_prefix, evaluation_prefix)):
        if not store.is_committed(needed):
            raise RegistryError(f"{store.url(needed)} is not committed: nothing to register")
    version = _claim_version(store, name)
    prefix = f"models/{name}/{version}"
    manifest = store.get_json(f"{dataset_prefix}/{MANIFEST}")
    card = {
        **card,
        "name": name,
        "version": version,
        "registered_at": _now(),
        "code": code_revision(),
        "lineage": {
            **card.get("lineage", {}),
            "checkpoint": store.url(checkpoint_prefix),
            "dataset_manifest": store.url(f"{dataset_prefix}/{MANIFEST}"),
            "tokenizer_sha256": manifest["tokenizer"]["sha256"],
            **({"evaluation": store.url(evaluation_prefix)} if evaluation_prefix else {}),
        },
    }
    with tempfile.TemporaryDirectory(prefix="pretrain-register-") as tmp:
        staging = Path(tmp)
        for key in store.list(checkpoint_prefix):
            rel = key[len(checkpoint_prefix) + 1 :]
            if rel.startswith("model/") or rel == "meta.json":
                store.download(key, staging / "checkpoint" / rel)
        store.download(f"{dataset_prefix}/{TOKENIZER}", staging / TOKENIZER)
        if evaluation_prefix:
            for key in store.list(evaluation_prefix):
                rel = key[len(evaluation_prefix) + 1 :]
                if rel == EVAL_RESULTS:
                    store.download(key, staging / "evaluation.json")
                elif rel.startswith(f"{HF_EXPORT}/"):
                    store.download(key, staging / rel)
                    card["hf_export"] = HF_EXPORT
        store.upload_dir(staging, prefix)
    store.put_json(f"{prefix}/card.json", card)
    store.put_bytes(f"{prefix}/card.md", card_markdown(card).encode())
    store.commit(prefix, {"version": version})
    for alias in aliases:
        set_alias(store, name, alias, version)
    return ModelRef(store=store.uri, name=name, version=version, prefix=prefix)


def set_alias(store: Store, name: str, alias: str, version: int) -> None:
    if not store.is_committed(f"models/{name}/{version}"):
        raise RegistryError(f"{name}:{version} is not a committed version")
    store.put_json(f"models/{name}/aliases/{alias}.json", {"version": version, "updated_at": _now()})


def list_models(store: Store) -> list[dict[str, Any]]:
    """One row per committed version: name, version, aliases, key metrics."""
    rows = []
    for name in store.children("models"):
        aliases = _aliases(store, name)
        for version in _versions(store, name):
            card = store.get_json(f"models/{name}/{version}/card.json")
            rows.append(
                {
                    "name": name,
                    "version": version,
                    "aliases": sorted(a for a, v in aliases.items() if v == version),
                    "registered_at": card.get("registered_at"),
                    "dataset": card.get("lineage", {}).get("dataset_version"),
                    "metrics": card.get("metrics", {}),
                    "uri": store.url(f"models/{name}/{version}"),
                }
            )
    return rows


def _aliases(store: Store, name: str) -> dict[str, int]:
    out = {}
    for key in store.list(f"models/{name}/aliases/"):
        if key.endswith(".json"):
            out[Path(key).stem] = store.get_json(key)["version"]
    return out


def resolve(store: Store, spec: str) -> tuple[str, int]:
    """``NAME``, ``NAME:VERSION`` or ``NAME:ALIAS`` → (name, version); NAME alone means latest."""
    name, _, which = spec.partition(":")
    which = which or "latest"
    if which.isdigit():
        version = int(which)
    else:
        try:
            version = store.get_json(f"models/{name}/aliases/{which}.json")["version"]
        except StoreError as e:
            raise RegistryError(f"model {name!r} has no alias {which!r} in {store.uri}") from e
    if not store.is_committed(f"models/{name}/{version}"):
        raise RegistryError(f"model {name}:{version} does not exist in {store.uri}")
    return name, version


def show(store: Store, spec: str) -> dict[str, Any]:
    name, version = resolve(store, spec)
    prefix = f"models/{name}/{version}"
    card = store.get_json(f"{prefix}/card.json")
    card["aliases"] = sorted(a for a, v in _aliases(store, name).items() if v == version)  # now, not at registration
    card["uri"] = store.url(prefix)
    card["files"] = [store.url(k) for k in store.list(prefix)]
    return card


def gate_decision(candidate_bpb: float, baseline: str, baseline_bpb: float, tolerance: float) -> tuple[bool, str]:
    """Whether the candidate takes the gate alias, and why (recorded on its card)."""
    if not baseline:
        return True, "no model holds the alias yet: the candidate takes it"
    if baseline_bpb < 0:
        return False, f"{baseline} uses another tokenizer or model shape: not comparable, alias kept"
    if candidate_bpb <= baseline_bpb + tolerance:
        return True, f"{candidate_bpb:.4f} bits/byte ≤ {baseline_bpb:.4f} + tolerance {tolerance}: promoted"
    return False, f"{candidate_bpb:.4f} bits/byte > {baseline_bpb:.4f} + tolerance {tolerance}: alias kept"


def promote(store: Store, spec: str, alias: str) -> int:
    """Point ``alias`` at the version ``spec`` names; returns that version."""
    if not alias or "/" in alias or alias.isdigit():
        raise RegistryError(f"invalid alias {alias!r}: use a name such as production")
    name, version = resolve(store, spec)
    set_alias(store, name, alias, version)
    return version


def download(store: Store, spec: str, dest: str | Path) -> Path:
    """Copy a committed version's files to ``dest``; returns the folder."""
    name, version = resolve(store, spec)
    prefix = f"models/{name}/{version}"
    target = Path(dest)
    for key in store.list(prefix):
        if not key.endswith(("/_COMMITTED", f"/{CLAIM}")):
            store.download(key, target / key[len(prefix) + 1 :])
    return target


def card_markdown(card: dict[str, Any]) -> str:
    lineage = card.get("lineage", {})
    metrics = card.get("metrics", {})
    lines = [
        f"# {card['name']} v{card['version']}",
        "",
        f"Registered {card['registered_at']} from commit `{card['code']['commit']}`"
        + (" (dirty tree)" if card["code"].get("dirty") else ""),
        "",
        "## Metrics",
        *[f"- {k}: {v:.4f}" if isinstance(v, float) else f"- {k}: {v}" for k, v in sorted(metrics.items())],
        "",
        "## Lineage",
        *[f"- {k}: {v}" for k, v in sorted(lineage.items())],
        "",
        "## Samples",
        "Greedy:",
        "```",
        str(card.get("sample", "")),
        "```",
        "Sampled:",
        "```",
        str(card.get("sampled", "")),
        "```",
    ]
    if card.get("hf_export"):
        lines += [
            "",
            "## Hugging Face",
            f"`{card['hf_export']}/` holds safetensors weights, a Llama `config.json` and the tokenizer.",
            f"After `pretrain registry download {card['name']}:{card['version']} DEST`:",
            "```python",
            "from transformers import AutoModelForCausalLM, AutoTokenizer",
            f'model = AutoModelForCausalLM.from_pretrained("DEST/{card["hf_export"]}")',
            f'tokenizer = AutoTokenizer.from_pretrained("DEST/{card["hf_export"]}")',
            "```",
        ]
    return "\n".join(lines) + "\n"
