"""Our trainer (ffbpe) writes the tokenizer HF's BpeTrainer writes, byte for byte."""

import pytest
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

from common.contracts import SPECIAL_TOKENS
from data_prep.config import TokenizerConfig
from data_prep.tokenizer import train_tokenizer
from tests.helpers import EDGE_CASES, LONG_RUNS, distinct_docs, multilingual_docs, stdlib_texts


def hf_trained(texts: list[str], config: TokenizerConfig) -> Tokenizer:
    """The reference: HF's trainer as the pipeline ran it before ffbpe."""
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=config.vocab_size,
        min_frequency=config.min_frequency,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(texts, trainer=trainer)
    return tokenizer


def corpus() -> list[str]:
    # Code, prose, eight scripts with emoji and astral letters, long runs without spaces, special tokens in text.
    return stdlib_texts(60) + distinct_docs(30) + multilingual_docs(40) + LONG_RUNS + EDGE_CASES


@pytest.mark.parametrize(
    "config",
    [
        TokenizerConfig(vocab_size=2048),  # every merge counted more than once: the vocabulary fills
        TokenizerConfig(vocab_size=65536, min_frequency=3),  # min_frequency stops it first
    ],
    ids=["vocab-size", "min-frequency"],
)
def test_our_trainer_writes_hf_trainers_tokenizer(config):
    texts = corpus()
    ours, reference = train_tokenizer(iter(texts), config), hf_trained(texts, config)
    assert ours.get_vocab_size() == reference.get_vocab_size() > 300
    assert ours.to_str() == reference.to_str()
    sample = texts[-len(EDGE_CASES) - len(LONG_RUNS) :]
    assert [e.ids for e in ours.encode_batch(sample)] == [e.ids for e in reference.encode_batch(sample)]
    assert ours.decode(ours.encode(texts[0]).ids) == texts[0]
