"""Tiny, randomly initialised Hugging Face checkpoints of each family we import, built here with
``transformers`` and ``tokenizers`` (no download): what the tests, the continue preset's demo and the
encoder benchmark import.

Each family's tokenizer is trained on the given texts in its family's own configuration, so the import
meets what a real checkpoint ships:

- **llama** (Llama 3): byte-level BPE behind Llama 3's split pattern, ``<|begin_of_text|>`` prepended to
  every text, ``<|end_of_text|>`` ending a document; Llama 3.x RoPE scaling.
- **mistral**: SentencePiece-style BPE (Metaspace, byte fallback), ``<s>`` prepended, ``</s>`` at the end.
- **qwen2** / **qwen3**: NFC, byte-level BPE behind Qwen's split pattern, ``<|endoftext|>`` at the end;
  Qwen3's head size differs from hidden / heads.
- **smollm**: a Llama with GPT-2's byte-level BPE and tied embeddings.

The weights are drawn wide (norms around 1, biases and every matrix with a spread of 0.2 where
``transformers`` would start norms at exactly 1 and biases at 0): a conversion that swapped two heads, dropped
a bias or a norm moves the logits far beyond the tests' tolerance.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

FAMILIES = ("llama", "mistral", "qwen2", "qwen3", "smollm")

LLAMA3_PATTERN = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
QWEN_PATTERN = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"

SHAPE = {"hidden_size": 64, "intermediate_size": 176, "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2}


def _byte_level(pattern: str | None, specials: list[str], texts: Sequence[str], vocab: int, nfc: bool):
    from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers

    tokenizer = Tokenizer(models.BPE())
    if nfc:
        tokenizer.normalizer = normalizers.NFC()
    if pattern is None:  # GPT-2's own split (SmolLM)
        tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    else:
        tokenizer.pre_tokenizer = pre_tokenizers.Sequence(
            [
                pre_tokenizers.Split(Regex(pattern), behavior="isolated", invert=False),
                pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=False, use_regex=False),
            ]
        )
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab, special_tokens=specials, initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tokenizer.train_from_iterator(texts, trainer)
    return tokenizer


def _sentencepiece_bpe(texts: Sequence[str], vocab: int):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

    tokenizer = Tokenizer(models.BPE(unk_token="<unk>", byte_fallback=True, fuse_unk=True))
    # Trained on words (a split at every space); encoding then splits nothing, as Llama 2 and Mistral's
    # converted tokenizers do (a Metaspace that only marks the spaces).
    tokenizer.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="always", split=True)
    bytes_ = [f"<0x{b:02X}>" for b in range(256)]
    trainer = trainers.BpeTrainer(vocab_size=vocab, special_tokens=["<unk>", "<s>", "</s>", *bytes_])
    tokenizer.train_from_iterator(texts, trainer)
    tokenizer.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="first", split=False)
    tokenizer.decoder = decoders.Sequence(
        [decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse(), decoders.Strip(content=" ", left=1, right=0)]
    )
    bos = tokenizer.token_to_id("<s>")
    tokenizer.post_processor = processors.TemplateProcessing(single="<s> $A", pair="<s> $A <s> $B", special_tokens=[("<s>", bos)])
    return tokenizer


def tokenizer_for(family: str, texts: Sequence[str], vocab: int = 640):
    """The family's tokenizer (a ``tokenizers.Tokenizer``) trained on ``texts``, and its special tokens:
    ``{"eos_token": ..., "bos_token": ... or None}``."""
    from tokenizers import processors

    if family == "llama":
        tokenizer = _byte_level(LLAMA3_PATTERN, ["<|begin_of_text|>", "<|end_of_text|>"], texts, vocab, nfc=False)
        bos = tokenizer.token_to_id("<|begin_of_text|>")
        tokenizer.post_processor = processors.Sequence(
            [
                processors.ByteLevel(trim_offsets=False),
                processors.TemplateProcessing(
                    single="<|begin_of_text|> $A",
                    pair="<|begin_of_text|> $A <|begin_of_text|> $B",
                    special_tokens=[("<|begin_of_text|>", bos)],
                ),
            ]
        )
        return tokenizer, {"eos_token": "<|end_of_text|>", "bos_token": "<|begin_of_text|>"}
    if family == "mistral":
        return _sentencepiece_bpe(texts, vocab), {"eos_token": "</s>", "bos_token": "<s>", "unk_token": "<unk>"}
    if family in ("qwen2", "qwen3"):
        tokenizer = _byte_level(QWEN_PATTERN, ["<|endoftext|>", "<|im_start|>", "<|im_end|>"], texts, vocab, nfc=True)
        tokenizer.post_processor = processors.ByteLevel(trim_offsets=False)
        return tokenizer, {"eos_token": "<|endoftext|>", "bos_token": None, "pad_token": "<|endoftext|>"}
    if family == "smollm":
        return _byte_level(None, ["<|endoftext|>"], texts, vocab, nfc=False), {
            "eos_token": "<|endoftext|>",
            "bos_token": "<|endoftext|>",
        }
    raise ValueError(f"no tiny {family!r}: one of {', '.join(FAMILIES)}")


def model_config(family: str, vocab_size: int, **overrides):
    """The family's ``transformers`` config of the tiny shape, ``vocab_size`` rows (a few more than the
    tokenizer's, as real checkpoints pad theirs)."""
    from transformers import LlamaConfig, MistralConfig, Qwen2Config, Qwen3Config

    shape = {**SHAPE, "vocab_size": vocab_size, "max_position_embeddings": 256, "initializer_range": 0.2}
    if family == "llama":
        rope = {
            "rope_type": "llama3",
            "rope_theta": 500000.0,
            "factor": 8.0,
            "low_freq_factor": 1.0,
            "high_freq_factor": 4.0,
            "original_max_position_embeddings": 32,
        }
        config = LlamaConfig(**shape, rope_parameters=rope, rms_norm_eps=1e-5, tie_word_embeddings=False)
    elif family == "smollm":
        config = LlamaConfig(**shape, rope_parameters={"rope_type": "default", "rope_theta": 10000.0}, tie_word_embeddings=True)
    elif family == "mistral":
        # One key/value head per query head (plain multi-head attention); the others group two per key/value head.
        rope = {"rope_type": "default", "rope_theta": 1000000.0}
        config = MistralConfig(**{**shape, "num_key_value_heads": 4}, sliding_window=None, rope_parameters=rope)
    elif family == "qwen2":
        config = Qwen2Config(**shape, tie_word_embeddings=True, rope_parameters={"rope_type": "default", "rope_theta": 1000000.0})
    elif family == "qwen3":
        config = Qwen3Config(
            **shape, head_dim=32, tie_word_embeddings=False, rope_parameters={"rope_type": "default", "rope_theta": 1000000.0}
        )
    else:
        raise ValueError(f"no tiny {family!r}: one of {', '.join(FAMILIES)}")
    for key, value in overrides.items():
        setattr(config, key, value)
    return config


def spread_weights(model, seed: int) -> None:
    """Every parameter drawn away from ``transformers``' initial values (norm weights 1 ± 0.2, biases and
    matrices ± 0.2), seeded: see the module docstring."""
    import torch

    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in sorted(model.named_parameters()):
            noise = torch.randn(p.shape, generator=generator) * 0.2
            p.copy_(1 + noise if "norm" in name else noise)


def build_tiny(family: str, dest: Path, texts: Sequence[str], seed: int = 0, max_shard_size: str | None = None) -> Path:
    """A tiny ``family`` checkpoint in ``dest`` as ``save_pretrained`` writes it (safetensors, config.json, the
    fast tokenizer's files), with ``_name_or_path`` naming it."""
    import torch
    from transformers import AutoModelForCausalLM, PreTrainedTokenizerFast

    tokenizer, specials = tokenizer_for(family, texts)
    vocab = tokenizer.get_vocab_size() + 5
    config = model_config(family, vocab)
    config.eos_token_id = tokenizer.token_to_id(specials["eos_token"])
    config.bos_token_id = tokenizer.token_to_id(specials["bos_token"]) if specials.get("bos_token") else None
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(config)
    spread_weights(model, seed)
    dest.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(dest, **({"max_shard_size": max_shard_size} if max_shard_size else {}))
    config_file = dest / "config.json"  # as a hub checkpoint's: the id it was saved from
    config_file.write_text(
        json.dumps({**json.loads(config_file.read_text()), "_name_or_path": f"tiny-random/{family}"}, indent=2)
    )
    fast = PreTrainedTokenizerFast(tokenizer_object=tokenizer, **{k: v for k, v in specials.items() if v})
    fast.save_pretrained(dest)
    (dest / "README.md").write_text(f"A tiny random {family} built by hf_interop.tiny for tests and demos.\n")
    return dest


def sample_texts(limit: int = 60) -> list[str]:
    """Python standard-library sources (the demo corpus): ``limit`` files, in a fixed order."""
    import sysconfig

    root = Path(sysconfig.get_paths()["stdlib"])
    files = sorted(p for p in root.glob("*.py") if p.stat().st_size > 2000)[:limit]
    return [p.read_text(encoding="utf-8", errors="replace") for p in files]


def main(argv: Sequence[str] | None = None) -> None:
    import argparse

    parser = argparse.ArgumentParser(description="Build a tiny random Hugging Face checkpoint (no download).")
    parser.add_argument("family", choices=FAMILIES)
    parser.add_argument("dest", type=Path)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    build_tiny(args.family, args.dest, sample_texts(), args.seed)
    print(json.dumps({"family": args.family, "dest": str(args.dest)}))


if __name__ == "__main__":
    main()
