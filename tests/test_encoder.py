"""The fast encoder gives HF ``tokenizers``' ids exactly, or hands over to HF."""

import random

import pytest
from tokenizers import Tokenizer, normalizers

from data_prep.config import TokenizerConfig
from data_prep.encoder import HF_PIECE_BYTES, FastBPE, HFEncoder, bmp_pretokenizer, make_encoder, pretokenizer
from data_prep.sources import _stdlib_files
from data_prep.tokenizer import encode_parallel, train_tokenizer
from tests.helpers import distinct_docs

EDGE_CASES = [
    "café naïve 一二三 ²³ x² emoji 😀😀 it's we'll I'd 'S 'LL",
    "tabs\t\t\nx\u3000y\u00a0z \u2003 w\n\n\n  \n a",
    "<|endoftext|>hello<|endoftext|> <|pad|>x<|endof",
    "\u0600\u0661\u0662 किताब 한국어 ა \u0301a\u0301 Ⅷ ٣٤",
    "   leading",
    "trailing   ",
    "\n",
    "a\n",
    "\x1c\x1dseparators\x85next line",
    "\U000e0001 tag \U0010ffff private \ue000 unassigned \U0003134b\U000e01f0",
    "12345 3.14 1,000 ...!!! ?? -- __init__ self._x=[1,2]",
    "line\r\nwindows\rmac",
    "",
]


@pytest.fixture(scope="module")
def corpus() -> list[str]:
    texts = []
    for path in _stdlib_files()[:50]:
        try:
            texts.append(path.read_text(encoding="utf-8"))
        except UnicodeDecodeError:
            continue
    return texts + distinct_docs(20) + EDGE_CASES


@pytest.fixture(scope="module")
def tokenizer(corpus):
    return train_tokenizer(corpus[:40], TokenizerConfig(vocab_size=1024))


@pytest.mark.slow
def test_fast_encoder_gives_hf_ids(tokenizer, corpus):
    fast = FastBPE(tokenizer)
    for text in corpus:
        assert fast.encode(text).tolist() == tokenizer.encode(text).ids, text[:80]
    # Caches warm: a second pass answers the same.
    assert [a.tolist() for a in fast.encode_batch(EDGE_CASES)] == [e.ids for e in tokenizer.encode_batch(EDGE_CASES)]


@pytest.mark.slow
def test_parallel_encoding_keeps_order_and_ids(tokenizer, corpus):
    expected = [e.ids for e in tokenizer.encode_batch(corpus)]
    for workers in (1, 2):
        assert [a.tolist() for a in encode_parallel(tokenizer, corpus, workers, batch_bytes=50_000)] == expected


def test_other_tokenizers_fall_back_to_hf(tokenizer):
    assert isinstance(make_encoder(tokenizer), FastBPE)
    lowercasing = train_tokenizer(distinct_docs(10), TokenizerConfig(vocab_size=300))
    lowercasing.normalizer = normalizers.Lowercase()
    encoder = make_encoder(lowercasing)
    assert isinstance(encoder, HFEncoder)
    assert encoder.encode_batch(["ABC"])[0].tolist() == lowercasing.encode("ABC").ids
    with pytest.raises(ValueError, match="normalizer"):
        FastBPE(lowercasing)


# Real sentences per script; the seeded mix below repeats them in new orders, as a corpus would.
SCRIPTS = {
    "cjk": ["无法打开文件，请检查权限。", "鉴定令牌过期处理已禁用", "日本語の文章には空白がありません。", "東京都の天気"],
    "hangul": ["마지막 로그인 후 로그인 시도가 실패하였습니다.", "암호 기한이 곧 끝납니다"],
    "kana": ["ひらがなとカタカナ", "ファイルを開けませんでした。もう一度お試しください"],
    "arabic": ["لا يمكن فتح الملف، يرجى التحقق من الأذونات.", "مرحبا بالعالم"],
    "cyrillic": ["Не удалось открыть файл: доступ запрещён.", "Привет, мир! Съешь же ещё этих мягких булок."],
    "devanagari": ["फ़ाइल खोली नहीं जा सकी, अनुमति जाँचें।", "नमस्ते दुनिया"],
    "emoji": ["👍🏽 done ✅", "👨‍👩‍👧‍👦 family", "🇯🇵🇰🇷 flags 😀😀😀", "🏳️‍🌈"],
    # Letters and numbers beyond U+FFFF (CJK extension B, mathematical letters and digits) next to others.
    "astral": ["𠀀𠀁漢字𠀂", "abc𝐀𝐁𝐂def", "x𝟙𝟚3"],
}


def multilingual_docs(n: int, seed: int = 0) -> list[str]:
    """Documents mixing the scripts' sentences, emoji between them (a fixed seed: always the same)."""
    rng = random.Random(seed)
    sentences = [s for group in SCRIPTS.values() for s in group]
    return ["\n".join(rng.choice(sentences) + rng.choice(["", " ", "😀", "。"]) for _ in range(30)) for _ in range(n)]


LONG_RUNS = [
    "".join(SCRIPTS["cjk"]) * 40,  # no spaces for ~2,000 characters
    "".join(SCRIPTS["kana"] + SCRIPTS["hangul"]).replace(" ", "") * 30,
    "あ" * 3000,
    "a" * 5000,
    " " * 3000 + "x",
    "!" * 2000,
    "😀" * 1000,
    "ـ" * 2000,  # Arabic tatweel
]


@pytest.fixture(scope="module")
def multilingual_tokenizer() -> Tokenizer:
    # Trained on these scripts, the vocabulary holds merges across UTF-8 character boundaries.
    return train_tokenizer(multilingual_docs(40), TokenizerConfig(vocab_size=1500))


def test_multilingual_and_long_runs_give_hf_ids(multilingual_tokenizer):
    fast = FastBPE(multilingual_tokenizer)
    texts = multilingual_docs(20, seed=1) + LONG_RUNS + [" ".join(LONG_RUNS)]
    for text in texts:
        assert fast.encode(text).tolist() == multilingual_tokenizer.encode(text).ids, text[:40]
    assert [a.tolist() for a in fast.encode_batch(texts)] == [e.ids for e in multilingual_tokenizer.encode_batch_fast(texts)]


def test_astral_letters_take_the_full_pattern(multilingual_tokenizer):
    fast = FastBPE(multilingual_tokenizer)
    for text in SCRIPTS["astral"]:
        assert bmp_pretokenizer().findall(text) != pretokenizer().findall(text)  # the case matters
        assert fast.encode(text).tolist() == multilingual_tokenizer.encode(text).ids, text


def test_own_merge_gives_hf_ids_at_every_length(multilingual_tokenizer):
    """Pieces of HF_PIECE_BYTES or more go to HF's model: our merge loop is checked here on its own."""
    fast = FastBPE(multilingual_tokenizer)
    pieces = {p for text in multilingual_docs(10, seed=2) + LONG_RUNS for p in pretokenizer().findall(text)}
    assert any(len(p.encode()) >= 1000 for p in pieces) and any(len(p.encode()) < HF_PIECE_BYTES for p in pieces)
    for piece in sorted(pieces):
        assert list(fast._merge(piece.encode())) == multilingual_tokenizer.encode(piece).ids, piece[:40]
