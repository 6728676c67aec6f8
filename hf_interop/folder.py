"""A Hugging Face checkpoint folder as ``save_pretrained`` writes it: ``config.json``, safetensors weights
(one file, or shards named by ``model.safetensors.index.json``), the fast tokenizer's ``tokenizer.json`` and
its ``tokenizer_config.json``. Only safetensors are read: a pickled ``pytorch_model.bin`` could run code."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from common.digests import file_sha256
from common.errors import UserError

INDEX = "model.safetensors.index.json"
SINGLE = "model.safetensors"
TOKENIZER_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "generation_config.json",
    "chat_template.jinja",
)
"""The files a model's tokenizer and generation defaults live in, kept with an imported model and exported with it."""


class CheckpointFolderError(UserError, ValueError):
    """A folder that is not a readable Hugging Face checkpoint; the message names the file."""


@dataclass(frozen=True)
class Folder:
    """What an import reads of a checkpoint folder."""

    path: Path
    config: dict
    weight_files: list[Path]
    tokenizer_files: dict[str, Path]

    @property
    def files(self) -> list[Path]:
        """Every file the import reads, the digests on the card."""
        return sorted({self.path / "config.json", *self.weight_files, *self.tokenizer_files.values()})

    def sha256(self) -> dict[str, str]:
        return {p.name: file_sha256(p) for p in self.files}

    def eod_token(self) -> str:
        """The token that ends a document: the tokenizer's ``eos_token``, else the config's ``eos_token_id``."""
        spec = self._json("tokenizer_config.json")
        eos = spec.get("eos_token")
        if isinstance(eos, dict):
            eos = eos.get("content")
        if isinstance(eos, str) and eos:
            return eos
        ids = self.config.get("eos_token_id")
        ids = ids[0] if isinstance(ids, list) and ids else ids
        if isinstance(ids, int):
            from tokenizers import Tokenizer

            token = Tokenizer.from_file(str(self.tokenizer_files["tokenizer.json"])).id_to_token(ids)
            if token:
                return token
        raise CheckpointFolderError(
            f"{self.path}: neither tokenizer_config.json's eos_token nor config.json's eos_token_id names the token that "
            "ends a document; set eos_token in tokenizer_config.json"
        )

    def _json(self, name: str) -> dict:
        path = self.tokenizer_files.get(name)
        return json.loads(path.read_text(encoding="utf-8")) if path else {}

    def name_or_path(self) -> str:
        return str(self.config.get("_name_or_path") or "")

    def revision(self) -> str:
        """The hub revision the folder came from, when it says (``huggingface_hub`` snapshots are named by it)."""
        return str(self.config.get("_commit_hash") or (self.path.name if self.path.parent.name == "snapshots" else ""))


def _read_json(path: Path) -> dict:
    try:
        value = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise CheckpointFolderError(f"{path} is missing: a Hugging Face checkpoint folder has one") from None
    except (ValueError, UnicodeDecodeError) as e:
        raise CheckpointFolderError(f"{path} is not JSON ({e})") from None
    if not isinstance(value, dict):
        raise CheckpointFolderError(f"{path} is not a JSON object")
    return value


def read_folder(path: Path) -> Folder:
    """The checkpoint folder ``path``, checked for every file the import needs (one line naming what is missing)."""
    path = Path(path)
    if not path.is_dir():
        raise CheckpointFolderError(
            f"{path} is not a folder: give the folder save_pretrained wrote (config.json, *.safetensors, tokenizer.json)"
        )
    config = _read_json(path / "config.json")
    if (path / INDEX).is_file():
        index = _read_json(path / INDEX)
        names = sorted(set((index.get("weight_map") or {}).values()))
        if not names:
            raise CheckpointFolderError(f"{path / INDEX} maps no tensor to a file")
        weights = [path / name for name in names]
        missing = [w.name for w in weights if not w.is_file()]
        if missing:
            raise CheckpointFolderError(f"{path}: the shards {', '.join(missing)} named by {INDEX} are missing")
    elif (path / SINGLE).is_file():
        weights = [path / SINGLE]
    else:
        pickled = sorted(p.name for p in path.glob("*.bin"))
        why = f" (only {', '.join(pickled)}: pickles, which could run code when read)" if pickled else ""
        raise CheckpointFolderError(
            f"{path} has no {SINGLE} or {INDEX}{why}: save it with save_pretrained(..., safe_serialization=True)"
        )
    tokenizer = {name: path / name for name in TOKENIZER_FILES if (path / name).is_file()}
    if "tokenizer.json" not in tokenizer:
        raise CheckpointFolderError(
            f"{path} has no tokenizer.json: save the fast tokenizer there (AutoTokenizer.from_pretrained(...).save_pretrained)"
        )
    return Folder(path, config, weights, tokenizer)


def read_weights(folder: Folder) -> dict:
    """Every tensor of the checkpoint, by name (float32: our CPU model's dtype; a GPU build casts on load)."""
    import torch
    from safetensors.torch import load_file

    tensors: dict = {}
    for file in folder.weight_files:
        for name, tensor in load_file(str(file)).items():
            tensors[name] = tensor.to(torch.float32)
    return tensors
