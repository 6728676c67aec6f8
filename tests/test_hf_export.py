"""The Hugging Face export: ``transformers`` loads it on CPU and reproduces our logits."""

import json

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from common.contracts import EOD_TOKEN
from data_prep.tokenizer import train_tokenizer
from hf_interop.export import export_hf
from tests.helpers import tiny_tokenizer
from training.config import ModelConfig, ParallelConfig
from training.distributed import init_distributed, shutdown_distributed
from training.model.gpt import build_gpt

SEQ_LEN = 32
TEXTS = ["def add(a, b):\n    return a + b\n" * 20, "The quick brown fox jumps over the lazy dog. " * 30, "naïve café 東京 " * 10]


@pytest.fixture
def tp1():
    init_distributed(ParallelConfig(tensor_parallel=1), seed=0, standalone=True)
    yield
    shutdown_distributed()


@pytest.mark.parametrize(
    "shape",
    [
        dict(num_layers=2, hidden_size=64, num_attention_heads=4, num_query_groups=2, tied_embeddings=True),
        dict(num_layers=3, hidden_size=96, num_attention_heads=6, num_query_groups=0, tied_embeddings=False, rotary_base=500),
    ],
    ids=["gqa-tied", "mha-untied"],
)
@pytest.mark.slow
def test_transformers_loads_the_export_and_matches_our_logits(tp1, tmp_path, shape):
    cfg = ModelConfig(**shape, kernels="torch")
    tokenizer = train_tokenizer(TEXTS, tiny_tokenizer())
    vocab = tokenizer.get_vocab_size()
    model = build_gpt(cfg, vocab, SEQ_LEN, tensor_parallel=1)
    with torch.no_grad():  # every weight away from its init (norms at 1), so a swapped tensor shows
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.1)
    model.eval()
    out = export_hf(model, cfg, tokenizer.to_str(), SEQ_LEN, tmp_path / "hf")

    hf = AutoModelForCausalLM.from_pretrained(out).eval()
    config = json.loads((out / "config.json").read_text())
    assert config["model_type"] == "llama" and config["num_key_value_heads"] == (cfg.num_query_groups or cfg.num_attention_heads)
    assert sum(p.numel() for p in hf.parameters()) == sum(p.numel() for p in model.parameters())

    ids = torch.randint(0, vocab, (3, SEQ_LEN), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        ours = model(ids, torch.arange(SEQ_LEN).unsqueeze(0).expand_as(ids), None)
        theirs = hf(ids).logits
    assert theirs.shape == ours.shape
    assert (theirs - ours).abs().max().item() < 1e-4

    hf_tokenizer = AutoTokenizer.from_pretrained(out)
    for text in TEXTS:
        assert hf_tokenizer(text).input_ids == tokenizer.encode(text).ids
    assert hf_tokenizer.eos_token == EOD_TOKEN and hf.config.eos_token_id == tokenizer.token_to_id(EOD_TOKEN)
