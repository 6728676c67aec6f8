"""``pretrain registry import DIR --name NAME``: a Hugging Face checkpoint folder registered as NAME's next
version, which ``train.init_from`` continues.

The entry holds what a trained entry holds: the weights as our megatron checkpoint (``checkpoint/``, loadable
at any layout), the model's own ``tokenizer.json``, a card (``lineage.imported_from`` names the architecture,
every file's sha256, ``_name_or_path`` and revision; ``lineage.eod_token`` the token that ends a document) and
a Hugging Face export of the converted weights (``hf/``) with the original's tokenizer files, the round trip.
An unsupported architecture or feature is refused in one line before anything is written.
"""

from __future__ import annotations

import dataclasses
import json
import tempfile
from pathlib import Path

from common.contracts import (
    ENTRY_CHECKPOINT,
    ENTRY_EVALUATION,
    HF_EXPORT,
    TOKENIZER,
    ImportedFrom,
    Lineage,
    ModelCard,
    ModelRef,
    model_prefix,
)
from common.digests import file_sha256, folder_digests
from common.errors import local_space
from hf_interop.families import Imported, imported_config
from hf_interop.folder import Folder, read_folder
from registry.card import code_revision, utc_now
from registry.imports import check_same_shape, import_identity, imported_version, register_staged
from storage import Store


def import_checkpoint(store: Store, path: Path, name: str) -> tuple[ModelRef, bool]:
    """Register the checkpoint folder ``path`` as ``name``'s next version; returns it and whether this call
    registered it (False: an identical import already had)."""
    folder = read_folder(path)
    imported = imported_config(folder.config, str(folder.path / "config.json"))
    eod = folder.eod_token()
    check_same_shape(store, name, dataclasses.asdict(imported.model))
    digests = folder.sha256()
    identity = import_identity(store, name, digests)
    done = imported_version(store, name, identity)
    if done is not None:
        return ModelRef(store=store.uri, name=name, version=done, prefix=model_prefix(name, done)), False
    with tempfile.TemporaryDirectory(prefix="pretrain-import-") as tmp, local_space(tmp, "the import's staging"):
        staging = Path(tmp)
        parameters = _convert(folder, imported, eod, staging)
        source = ImportedFrom(
            architecture=imported.architecture,
            family=imported.family,
            files=digests,
            name_or_path=folder.name_or_path(),
            revision=folder.revision(),
            folder=str(folder.path.resolve()),
        )
        tokenizer_sha = file_sha256(staging / TOKENIZER)

        def card_for(version: int) -> ModelCard:
            prefix = model_prefix(name, version)
            return ModelCard(
                name=name,
                version=version,
                registered_at=utc_now(),
                metrics={"parameters": float(parameters)},
                sample="",
                sampled="",
                lineage=Lineage(
                    dataset_version="",
                    dataset="",
                    dataset_manifest="",
                    tokenizer_sha256=tokenizer_sha,
                    training_run="",
                    training_steps=0,
                    checkpoint=f"{prefix}/{ENTRY_CHECKPOINT}",
                    eod_token=eod,
                    imported_from=source,
                ),
                layouts=[],
                config={"model": dataclasses.asdict(imported.model), "data": {"seq_len": imported.max_positions}},
                code=code_revision(),
                hf_export=HF_EXPORT,
            )

        return register_staged(store, name, identity, staging, card_for), True


def _convert(folder: Folder, imported: Imported, eod: str, staging: Path) -> int:
    """Stage the entry's checkpoint, tokenizer and Hugging Face export; the parameter count."""
    from hf_interop.convert import load_model
    from hf_interop.export import export_hf
    from training.checkpointing.saving import write_weights
    from training.config import ParallelConfig
    from training.distributed import init_distributed, shutdown_distributed

    tokenizer_json = folder.tokenizer_files["tokenizer.json"].read_text(encoding="utf-8")
    init_distributed(ParallelConfig(tensor_parallel=1), seed=0, standalone=True)
    try:
        model, _ = load_model(folder)
        write_weights(
            model, staging / ENTRY_CHECKPOINT, {"step": 0, "model": dataclasses.asdict(imported.model), "imported": True}
        )
        (staging / TOKENIZER).write_text(tokenizer_json, encoding="utf-8")
        originals = {n: p.read_text(encoding="utf-8") for n, p in folder.tokenizer_files.items() if n != "tokenizer.json"}
        export_hf(model, imported.model, tokenizer_json, imported.max_positions, staging / HF_EXPORT, eod, originals)
        # Where a trained entry keeps its export's digests (its evaluation's record): a continued run's lm-eval
        # scores this export as its gate's baseline only after checking them. Nothing was evaluated.
        record = {"imported": True, "export_digests": folder_digests(staging / HF_EXPORT)}
        (staging / ENTRY_EVALUATION).write_text(json.dumps(record, indent=2, sort_keys=True))
        return sum(p.numel() for p in model.parameters())
    finally:
        shutdown_distributed()
