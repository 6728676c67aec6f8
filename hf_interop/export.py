"""Our GPT as a Hugging Face checkpoint of its family (``hf_interop.families``): safetensors, ``config.json``,
``generation_config.json`` and the tokenizer's files, which ``from_pretrained`` loads.

A model trained here from scratch exports as a Llama with our tokenizer: its ``<|endoftext|>`` ends documents
and opens generation (documents are separated, not opened), ``<|pad|>`` pads. A model imported from a
Hugging Face checkpoint, or continued from one, exports as its family with the original's tokenizer files
(``tokenizer_config.json``, special tokens, chat template), so it loads as the original does.

The vocabulary: an imported model's own ``vocab_size`` rows (``model.vocab_size``); a model trained here keeps
megatron's padding, whose rows never win an argmax for trained models (they get no gradient from the labels):
the tokenizer simply never produces those ids.
"""

from __future__ import annotations

import json
from pathlib import Path

from common.contracts import EOD_TOKEN, PAD_TOKEN
from hf_interop.families import exported_config
from hf_interop.weights import to_hf
from training.config import ModelConfig

WEIGHTS = "model.safetensors"


def tokenizer_files(tokenizer_json: str, seq_len: int) -> dict[str, str]:
    """Our tokenizer in the layout ``AutoTokenizer.from_pretrained`` reads."""
    config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "eos_token": EOD_TOKEN,
        "bos_token": EOD_TOKEN,
        "pad_token": PAD_TOKEN,
        "add_bos_token": False,
        "add_eos_token": False,
        "model_max_length": seq_len,
        "clean_up_tokenization_spaces": False,
    }
    specials = {"eos_token": EOD_TOKEN, "bos_token": EOD_TOKEN, "pad_token": PAD_TOKEN}
    return {
        "tokenizer.json": tokenizer_json,
        "tokenizer_config.json": json.dumps(config, indent=2),
        "special_tokens_map.json": json.dumps(specials, indent=2),
    }


def _special(files: dict[str, str], key: str) -> str | None:
    """A special token the tokenizer's files name (``tokenizer_config.json``, else ``special_tokens_map.json``)."""
    for name in ("tokenizer_config.json", "special_tokens_map.json"):
        if name in files:
            value = json.loads(files[name]).get(key)
            value = value.get("content") if isinstance(value, dict) else value
            if isinstance(value, str) and value:
                return value
    return None


def export_hf(
    model,
    model_cfg: ModelConfig,
    tokenizer_json: str,
    seq_len: int,
    out_dir: Path,
    eod_token: str = EOD_TOKEN,
    original_files: dict[str, str] | None = None,
) -> Path:
    """Write ``model`` (a TP=1 GPTModel) as a Hugging Face checkpoint of its family in ``out_dir``.
    ``original_files``: an imported model's tokenizer files (``hf_interop.folder.TOKENIZER_FILES`` but
    ``tokenizer.json``, which is ``tokenizer_json``); None: ours."""
    from safetensors.torch import save_file
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_str(tokenizer_json)
    if original_files is None:
        files = tokenizer_files(tokenizer_json, seq_len)
        bos = pad = None
    else:
        files = {**{k: v for k, v in original_files.items() if k != "generation_config.json"}, "tokenizer.json": tokenizer_json}
        bos, pad = _special(files, "bos_token"), _special(files, "pad_token")
    eod_id = tokenizer.token_to_id(eod_token)
    pad_id = tokenizer.token_to_id(pad or PAD_TOKEN)
    bos_id = tokenizer.token_to_id(bos) if bos else None
    megatron = {k: v for k, v in model.state_dict().items() if not k.endswith("_extra_state")}
    embedding = megatron["embedding.word_embeddings.weight"]
    rows = model_cfg.vocab_size or embedding.shape[0]
    out_dir.mkdir(parents=True, exist_ok=True)
    save_file(to_hf(megatron, model_cfg, rows), str(out_dir / WEIGHTS), metadata={"format": "pt"})
    dtype = str(embedding.dtype).removeprefix("torch.")  # as trained: float32 on CPU, bfloat16 on GPU
    config = exported_config(model_cfg, rows, seq_len, eod_id, pad_id, bos_id, dtype)
    (out_dir / "config.json").write_text(json.dumps(config, indent=2))
    generation = {"bos_token_id": config["bos_token_id"], "eos_token_id": eod_id, "pad_token_id": pad_id, "do_sample": False}
    (out_dir / "generation_config.json").write_text(json.dumps(generation, indent=2))
    for name, text in files.items():
        (out_dir / name).write_text(text)
    return out_dir
