"""Our GPT from a Hugging Face checkpoint folder, and back (whole, on one process: TP=1, PP=1).

megatron's groups must be set up (``training.distributed.init_distributed``, standalone for one process).
"""

from __future__ import annotations

from pathlib import Path

import torch

from hf_interop.families import Imported, UnsupportedCheckpoint, imported_config
from hf_interop.folder import Folder, read_weights
from hf_interop.weights import to_megatron, unused
from training.model.gpt import build_gpt


def tokenizer_size(folder: Folder) -> int:
    from tokenizers import Tokenizer

    return Tokenizer.from_file(str(folder.tokenizer_files["tokenizer.json"])).get_vocab_size()


def load_model(folder: Folder) -> tuple[torch.nn.Module, Imported]:
    """Our model (TP=1) holding the checkpoint's weights, in eval mode, and what its config said."""
    imported = imported_config(folder.config, str(folder.path / "config.json"))
    tokens = tokenizer_size(folder)
    if tokens > imported.model.vocab_size:
        raise UnsupportedCheckpoint(
            f"{folder.path}: tokenizer.json has {tokens} tokens but the embedding only {imported.model.vocab_size} rows; "
            "nothing was written"
        )
    hf = read_weights(folder)
    left = unused(hf, imported.model)
    if left:
        raise UnsupportedCheckpoint(
            f"{folder.path}: tensors our {imported.family} model has no place for ({', '.join(left[:4])}"
            f"{', …' if len(left) > 4 else ''}); nothing was written"
        )
    model = build_gpt(imported.model, tokens, imported.max_positions, tensor_parallel=1)
    padded = model.embedding.word_embeddings.weight.shape[0]
    try:
        state = to_megatron(hf, imported.model, padded)
    except KeyError as e:
        raise UnsupportedCheckpoint(f"{folder.path}: the checkpoint has no tensor {e.args[0]}; nothing was written") from None
    own = model.state_dict()
    wrong = [
        f"{k} {tuple(v.shape)} (ours {tuple(own[k].shape)})" for k, v in state.items() if k in own and own[k].shape != v.shape
    ]
    if wrong:
        raise UnsupportedCheckpoint(f"{folder.path}: tensors of another shape than config.json says: {', '.join(wrong[:3])}")
    missing, unexpected = model.load_state_dict(state, strict=False)
    missing = [k for k in missing if not k.endswith("_extra_state")]
    if missing or unexpected:
        raise UnsupportedCheckpoint(
            f"{folder.path}: conversion left {missing or unexpected} unfilled"
        )  # a bug of ours, said plainly
    return model.eval(), imported


def hf_logits(path: Path, ids: torch.Tensor) -> torch.Tensor:
    """``transformers``' logits of the checkpoint in ``path`` (fp32, eager attention) for ``ids``."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32, attn_implementation="eager").eval()
    with torch.no_grad():
        return model(ids).logits


def our_logits(model: torch.nn.Module, ids: torch.Tensor) -> torch.Tensor:
    """Our model's logits for ``ids`` (``[batch, seq]``), cut to the unpadded vocabulary by the caller."""
    positions = torch.arange(ids.shape[1]).unsqueeze(0).expand_as(ids)
    with torch.no_grad():
        return model(ids, positions, None)
