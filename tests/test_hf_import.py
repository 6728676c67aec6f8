"""``pretrain registry import``: every family's tiny checkpoint (built here by ``transformers``, no download)
gives transformers' logits in our model, and the entry's Hugging Face export gives them back (the round
trip); the card names the source; what is not our GPT is refused in one line before anything is written.
TP=2 and PP=2: ``tests/test_hf_import_parallel.py``."""

import json
import shutil
import subprocess

import pytest
import torch
from tokenizers import Tokenizer

from common.contracts import HF_EXPORT
from common.digests import file_sha256
from hf_interop.convert import hf_logits, our_logits
from hf_interop.families import UnsupportedCheckpoint
from hf_interop.folder import CheckpointFolderError
from hf_interop.tiny import FAMILIES, sample_texts
from registry.card import read_card
from registry.hf_import import import_checkpoint
from registry.names import RegistryError
from storage import open_store
from tests.helpers import BIN, ROOT
from training.checkpointing import checkpoint
from training.config import ModelConfig, ParallelConfig
from training.distributed import init_distributed, shutdown_distributed
from training.model.gpt import build_gpt
from training.observe.metrics import non_embedding_params

EXPORTED = {"llama": "LlamaForCausalLM", "mistral": "LlamaForCausalLM", "qwen2": "Qwen2ForCausalLM", "qwen3": "Qwen3ForCausalLM"}
EOD = {
    "llama": "<|end_of_text|>",
    "mistral": "</s>",
    "qwen2": "<|endoftext|>",
    "qwen3": "<|endoftext|>",
    "smollm": "<|endoftext|>",
}


@pytest.fixture(scope="module")
def imported(tiny_hf_models, tmp_path_factory):
    """Every family imported once into one local store: (store, {family: ModelRef})."""
    store = open_store(str(tmp_path_factory.mktemp("import-store")))
    refs = {}
    for family in FAMILIES:
        ref, registered = import_checkpoint(store, tiny_hf_models[family], f"tiny-{family}")
        assert registered and ref.version == 1
        refs[family] = ref
    return store, refs


def text_ids(folder) -> torch.Tensor:
    """Two rows of 64 ids of real text (Python sources) as the family's tokenizer encodes them."""
    tokenizer = Tokenizer.from_file(str(folder / "tokenizer.json"))
    texts = sample_texts(8)
    return torch.tensor([tokenizer.encode(texts[i]).ids[:64] for i in (3, 7)])


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.slow
def test_the_imported_model_gives_transformers_logits_and_its_export_round_trips(imported, tiny_hf_models, family, tmp_path):
    store, refs = imported
    card = read_card(store, refs[family].prefix)
    model_cfg = ModelConfig(**card.config["model"])
    original = tiny_hf_models[family]
    ids = text_ids(original)
    theirs = hf_logits(original, ids)
    assert theirs.std() > 0.5  # logits far from zero: a swapped head or a lost bias shows

    init_distributed(ParallelConfig(tensor_parallel=1), seed=0, standalone=True)
    try:
        model = build_gpt(model_cfg, model_cfg.vocab_size, 256, tensor_parallel=1)
        checkpoint.load_model(
            model, checkpoint.fetch(store, f"{refs[family].prefix}/checkpoint", tmp_path / "ckpt", refs[family].prefix)
        )
        ours = our_logits(model.eval(), ids)[..., : theirs.shape[-1]]
        # MFU counts the layers' weights from the config: biases, q/k norms and head size included.
        embeddings = {"embedding.word_embeddings.weight", "output_layer.weight"}
        layers = sum(p.numel() for name, p in model.named_parameters() if name not in embeddings)
        assert non_embedding_params(model_cfg) == layers
    finally:
        shutdown_distributed()
    assert (ours - theirs).abs().max().item() <= 1e-4

    # The entry's export: the same family (a Mistral without sliding window is a Llama), the original's
    # vocabulary size and tokenizer files, and transformers' logits again.
    export = tmp_path / "export"
    store.download_dir(f"{refs[family].prefix}/{HF_EXPORT}", export)
    config = json.loads((export / "config.json").read_text())
    source = json.loads((original / "config.json").read_text())
    assert config["architectures"] == [EXPORTED.get(family, "LlamaForCausalLM")]
    assert config["vocab_size"] == source["vocab_size"] and config["tie_word_embeddings"] == source["tie_word_embeddings"]
    assert (export / "tokenizer_config.json").read_bytes() == (original / "tokenizer_config.json").read_bytes()
    assert (hf_logits(export, ids) - theirs).abs().max().item() <= 1e-4


@pytest.mark.slow
def test_the_card_names_the_source_and_an_import_is_registered_once(imported, tiny_hf_models, tmp_path):
    store, refs = imported
    qwen = tiny_hf_models["qwen3"]
    card = read_card(store, refs["qwen3"].prefix)
    source = card.lineage.imported_from
    assert (source.architecture, source.family, source.name_or_path) == ("Qwen3ForCausalLM", "qwen3", "tiny-random/qwen3")
    assert source.files == {p.name: file_sha256(p) for p in qwen.iterdir() if p.name != "README.md"}
    assert card.lineage.tokenizer_sha256 == file_sha256(qwen / "tokenizer.json")
    model = card.config["model"]
    assert (model["qk_norm"], model["qkv_bias"], model["head_dim"], model["num_query_groups"]) == (True, False, 32, 2)
    assert {f: read_card(store, refs[f].prefix).lineage.eod_token for f in FAMILIES} == EOD
    llama = read_card(store, refs["llama"].prefix).config["model"]
    assert (llama["rope_scaling_factor"], llama["rope_original_max_positions"], llama["rotary_base"]) == (8.0, 32, 500000)

    # The same folder again: the same version, nothing written.
    before = sorted(store.list("models/"))
    assert import_checkpoint(store, qwen, "tiny-qwen3") == (refs["qwen3"], False)
    assert sorted(store.list("models/")) == before
    # Other weights of the same shape: the name's next version.
    changed = shutil.copytree(qwen, tmp_path / "qwen3-b")
    config = json.loads((changed / "config.json").read_text())
    (changed / "config.json").write_text(json.dumps({**config, "_name_or_path": "tiny-random/qwen3-b"}))
    ref, registered = import_checkpoint(store, changed, "tiny-qwen3")
    assert registered and ref.version == 2
    # Another shape under that name: refused, naming the difference, nothing written.
    with pytest.raises(
        RegistryError, match=r"tiny-qwen3 holds models of another shape \(its version 2: head_dim: 32 there, 0 here"
    ):
        import_checkpoint(store, tiny_hf_models["qwen2"], "tiny-qwen3")
    assert not [k for k in store.list("models/tiny-qwen3/") if k.startswith("models/tiny-qwen3/3")]


def edited(folder, tmp_path, **changes):
    """A copy of ``folder`` whose config.json has ``changes`` (None deletes a key)."""
    copy = shutil.copytree(folder, tmp_path / f"edited-{len(list(tmp_path.iterdir()))}")
    config = json.loads((copy / "config.json").read_text())
    config.update(changes)
    (copy / "config.json").write_text(json.dumps({k: v for k, v in config.items() if v is not None}))
    return copy


REFUSALS = [
    ("llama", {"architectures": ["MixtralForCausalLM"]}, "architecture MixtralForCausalLM is not supported"),
    ("qwen2", {"num_experts": 8}, "Qwen2ForCausalLM with a mixture of experts is not supported"),
    ("mistral", {"sliding_window": 4096}, "MistralForCausalLM with a sliding attention window (4096 tokens) is not supported"),
    ("qwen3", {"use_sliding_window": True, "sliding_window": 64}, "a sliding attention window (use_sliding_window, 64 tokens)"),
    ("llama", {"attention_bias": True}, "biases on the attention projections, the output one included (attention_bias)"),
    ("smollm", {"rope_parameters": {"rope_type": "yarn", "rope_theta": 10000.0, "factor": 4.0}}, "RoPE scaling of type 'yarn'"),
    ("llama", {"hidden_act": "gelu"}, "the activation 'gelu' (SwiGLU takes silu)"),
]


@pytest.mark.parametrize(("family", "changes", "said"), REFUSALS, ids=[r[2].split(" (")[0][:40] for r in REFUSALS])
def test_what_is_not_our_gpt_is_refused_in_one_line_before_anything_is_written(tiny_hf_models, tmp_path, family, changes, said):
    store = open_store(str(tmp_path / "store"))
    with pytest.raises(UnsupportedCheckpoint) as raised:
        import_checkpoint(store, edited(tiny_hf_models[family], tmp_path, **changes), "refused")
    assert said in str(raised.value) and "nothing was written" in str(raised.value) and "\n" not in str(raised.value)
    assert store.list("") == []


def test_the_end_of_text_token_comes_from_the_tokenizer_config_else_the_config_id(tiny_hf_models, tmp_path):
    from hf_interop.folder import read_folder

    folder = shutil.copytree(tiny_hf_models["mistral"], tmp_path / "mistral")
    assert read_folder(folder).eod_token() == "</s>"
    spec = json.loads((folder / "tokenizer_config.json").read_text())
    (folder / "tokenizer_config.json").write_text(json.dumps({k: v for k, v in spec.items() if k != "eos_token"}))
    assert read_folder(folder).eod_token() == "</s>"  # config.json's eos_token_id, through the tokenizer
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**config, "eos_token_id": None}))
    with pytest.raises(CheckpointFolderError, match="names the token that ends a document; set eos_token"):
        read_folder(folder).eod_token()


def test_a_folder_without_safetensors_or_tokenizer_says_what_to_save(tiny_hf_models, tmp_path):
    store = open_store(str(tmp_path / "store"))
    pickled = shutil.copytree(tiny_hf_models["qwen2"], tmp_path / "pickled")
    (pickled / "model.safetensors").rename(pickled / "pytorch_model.bin")
    with pytest.raises(
        CheckpointFolderError, match=r"no model.safetensors or model.safetensors.index.json \(only pytorch_model.bin: pickles"
    ):
        import_checkpoint(store, pickled, "x")
    slow = shutil.copytree(tiny_hf_models["qwen2"], tmp_path / "slow")
    (slow / "tokenizer.json").unlink()
    with pytest.raises(CheckpointFolderError, match="has no tokenizer.json: save the fast tokenizer there"):
        import_checkpoint(store, slow, "x")
    assert store.list("") == []


def test_the_command_refuses_in_one_line_and_exit_2(tiny_hf_models, tmp_path):
    folder = edited(tiny_hf_models["mistral"], tmp_path, sliding_window=4096)
    store = tmp_path / "store"
    result = subprocess.run(
        [str(BIN / "pretrain"), "registry", "import", str(folder), "--name", "m", "--store", str(store)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 2, result.stderr
    assert result.stderr.splitlines() == [
        f"error: {folder}/config.json: MistralForCausalLM with a sliding attention window (4096 tokens) is not supported; "
        "nothing was written"
    ]
    assert not store.exists() or not any(store.rglob("*.json"))
