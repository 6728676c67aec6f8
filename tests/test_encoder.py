"""The encoder gives HF ``tokenizers``' ids exactly, or hands over to HF."""

import copy
import json
import os
import subprocess
import sys
import unicodedata

import pytest
from tokenizers import Tokenizer, normalizers

from data_prep.config import TokenizerConfig
from data_prep.encoder import THREADS_VARIABLE, FastokensEncoder, HFEncoder, make_encoder, unsupported_reason
from data_prep.tokenizer import encode_parallel, train_tokenizer
from tests.helpers import EDGE_CASES, LONG_RUNS, SCRIPTS, distinct_docs, multilingual_docs, stdlib_texts


@pytest.fixture(scope="module")
def corpus() -> list[str]:
    return stdlib_texts(50) + distinct_docs(20) + EDGE_CASES


@pytest.fixture(scope="module")
def tokenizer(corpus):
    return train_tokenizer(corpus[:40], TokenizerConfig(vocab_size=1024))


def test_encoder_gives_hf_ids(tokenizer, corpus):
    encoder = make_encoder(tokenizer)
    assert isinstance(encoder, FastokensEncoder)
    assert [a.tolist() for a in encoder.encode_batch(corpus)] == [e.ids for e in tokenizer.encode_batch(corpus)]
    for text in EDGE_CASES:  # one at a time too: a batch of one, an empty text
        assert encoder.encode_batch([text])[0].tolist() == tokenizer.encode(text).ids, text[:80]
    assert encoder.encode_batch([]) == []


@pytest.mark.slow
def test_parallel_encoding_keeps_order_and_ids(tokenizer, corpus):
    expected = [e.ids for e in tokenizer.encode_batch(corpus)]
    for workers in (1, 2):
        assert [a.tolist() for a in encode_parallel(tokenizer, corpus, workers, batch_bytes=50_000)] == expected


def test_other_tokenizers_fall_back_to_hf():
    lowercasing = train_tokenizer(distinct_docs(10), TokenizerConfig(vocab_size=300))
    lowercasing.normalizer = normalizers.Lowercase()
    encoder = make_encoder(lowercasing)
    assert isinstance(encoder, HFEncoder)
    assert encoder.encode_batch(["ABC"])[0].tolist() == lowercasing.encode("ABC").ids
    with pytest.raises(ValueError, match="normalizer"):
        FastokensEncoder(lowercasing)


def test_an_encoder_runs_on_one_thread(tokenizer, tmp_path):
    """Each data-prep worker process encodes on one core: fastokens, left alone, adds a thread of its own."""
    tokenizer.save(str(tmp_path / "tokenizer.json"))
    script = f"""
import os
from tokenizers import Tokenizer
from data_prep.encoder import make_encoder
encoder = make_encoder(Tokenizer.from_file({str(tmp_path / "tokenizer.json")!r}))
encoder.encode_batch(["some text to encode, long enough to be worth a thread " * 2000] * 64)
print(*(open(f"/proc/self/task/{{task}}/comm").read().strip() for task in os.listdir("/proc/self/task")))
"""
    env = {k: v for k, v in os.environ.items() if k != THREADS_VARIABLE}
    threads = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, check=True).stdout
    assert threads.split() and not [name for name in threads.split() if name.startswith("fastokens")], threads


@pytest.fixture(scope="module")
def multilingual_tokenizer() -> Tokenizer:
    # Trained on these scripts, the vocabulary holds merges across UTF-8 character boundaries.
    return train_tokenizer(multilingual_docs(40), TokenizerConfig(vocab_size=1500))


def test_multilingual_long_runs_and_astral_letters_give_hf_ids(multilingual_tokenizer):
    encoder = make_encoder(multilingual_tokenizer)
    texts = multilingual_docs(20, seed=1) + LONG_RUNS + [" ".join(LONG_RUNS)] + SCRIPTS["astral"]
    assert [a.tolist() for a in encoder.encode_batch(texts)] == [e.ids for e in multilingual_tokenizer.encode_batch(texts)]


# --- imported models' tokenizers (hf_interop.tiny builds each family's real configuration, no download) ---

# The encoder make_encoder must choose per family: fastokens where its ids are proven equal to HF's, HF elsewhere
# (Mistral's Metaspace pre-tokenizer, which fastokens 0.3.5 cannot load, and its byte fallback).
CHOSEN = {
    "llama": FastokensEncoder,
    "mistral": HFEncoder,
    "qwen2": FastokensEncoder,
    "qwen3": FastokensEncoder,
    "smollm": FastokensEncoder,
}


@pytest.fixture(scope="module")
def imported_texts() -> list[str]:
    """Standard-library sources, multilingual documents, the same decomposed (NFD, which Qwen's NFC normalizer
    recomposes), the edge cases and long runs."""
    multilingual = multilingual_docs(10, seed=2)
    return stdlib_texts(15) + multilingual + [unicodedata.normalize("NFD", t) for t in multilingual] + EDGE_CASES + LONG_RUNS


@pytest.fixture(scope="module")
def imported_tokenizers() -> dict[str, Tokenizer]:
    from hf_interop.tiny import FAMILIES, sample_texts, tokenizer_for

    # Trained on code and the scripts: merges within and across UTF-8 characters, as a real vocabulary has.
    texts = sample_texts(8) + multilingual_docs(20)
    assert set(FAMILIES) == set(CHOSEN), "a new family: say which encoder it must get"
    return {family: tokenizer_for(family, texts, vocab=1024)[0] for family in FAMILIES}


@pytest.mark.parametrize("family", sorted(CHOSEN))
def test_imported_tokenizers_get_the_proven_encoder_and_hf_ids(family, imported_tokenizers, imported_texts):
    tokenizer = imported_tokenizers[family]
    encoder = make_encoder(tokenizer)
    assert type(encoder) is CHOSEN[family], unsupported_reason(json.loads(tokenizer.to_str()))
    # HF's encode_batch with its post-processor: Llama 3's <|begin_of_text|> and Mistral's <s> in front of every text.
    want = [e.ids for e in tokenizer.encode_batch(imported_texts)]
    assert [a.tolist() for a in encoder.encode_batch(imported_texts)] == want
    if family in ("llama", "mistral"):
        bos = tokenizer.token_to_id({"llama": "<|begin_of_text|>", "mistral": "<s>"}[family])
        assert all(ids[:1] == [bos] for ids in want)


def test_fastokens_cannot_load_mistral_so_hf_encodes_it(imported_tokenizers):
    """The measured reason behind Mistral's HF encoder: fastokens 0.3.5 refuses its Metaspace pre-tokenizer (a
    release that loads it must be measured before the rule admits it)."""
    import fastokens

    spec = imported_tokenizers["mistral"].to_str()
    with pytest.raises(ValueError, match="Metaspace"):
        fastokens.Tokenizer.from_json_str(spec)
    with pytest.raises(ValueError, match="pre-tokenizer"):
        FastokensEncoder(imported_tokenizers["mistral"])


def test_llama3_ignore_merges_gives_hf_ids(imported_tokenizers, imported_texts):
    """Llama 3's tokenizer.json sets ignore_merges (a word in the vocabulary is one token, whatever the merges
    say). With a merge in seven dropped, HF's ids change with it, and fastokens still gives HF's."""
    spec = json.loads(imported_tokenizers["llama"].to_str())
    spec["model"]["merges"] = [m for i, m in enumerate(spec["model"]["merges"]) if i % 7 != 3]
    following_merges = Tokenizer.from_str(json.dumps(spec))
    spec["model"]["ignore_merges"] = True
    tokenizer = Tokenizer.from_str(json.dumps(spec))
    encoder = make_encoder(tokenizer)
    assert isinstance(encoder, FastokensEncoder)
    want = [e.ids for e in tokenizer.encode_batch(imported_texts)]
    assert want != [e.ids for e in following_merges.encode_batch(imported_texts)], "ignore_merges changes nothing here"
    assert [a.tolist() for a in encoder.encode_batch(imported_texts)] == want


def _edited(spec: dict, path: tuple, value) -> dict:
    spec = copy.deepcopy(spec)
    *parents, last = path
    node = spec
    for key in parents:
        node = node[key]
    node[last] = value
    return spec


def test_the_rule_admits_only_what_was_measured(imported_tokenizers):
    """Each step away from a proven configuration sends the tokenizer to HF: the rule names the configurations
    measured equal, not what fastokens happens to load."""
    llama = json.loads(imported_tokenizers["llama"].to_str())
    qwen = json.loads(imported_tokenizers["qwen2"].to_str())
    split, byte_level = ("pre_tokenizer", "pretokenizers", 0), ("pre_tokenizer", "pretokenizers", 1)
    template = ("post_processor", "processors", 1)
    bos = {"SpecialToken": {"id": "<|begin_of_text|>", "type_id": 0}}
    assert unsupported_reason(llama) == unsupported_reason(qwen) == ""
    refused = {
        "a normalizer other than NFC": _edited(qwen, ("normalizer",), {"type": "NFKC"}),
        "a Split on a pattern not measured": _edited(llama, (*split, "pattern"), {"Regex": r" ?\p{L}+| ?\p{N}+|\s+"}),
        "a Split that merges with the previous piece": _edited(llama, (*split, "behavior"), "MergedWithPrevious"),
        "an inverted Split": _edited(llama, (*split, "invert"), True),
        "ByteLevel with its own regex after the Split": _edited(llama, (*byte_level, "use_regex"), True),
        "ByteLevel adding a prefix space": _edited(llama, (*byte_level, "add_prefix_space"), True),
        "a template with two tokens in front": _edited(
            llama, (*template, "single"), [bos, bos, {"Sequence": {"id": "A", "type_id": 0}}]
        ),
        "a template then ByteLevel": _edited(
            llama, ("post_processor", "processors"), llama["post_processor"]["processors"][::-1]
        ),
        "byte fallback": _edited(llama, ("model", "byte_fallback"), True),
    }
    for what, spec in refused.items():
        assert unsupported_reason(spec), what
        assert isinstance(make_encoder(Tokenizer.from_str(json.dumps(spec))), HFEncoder), what
