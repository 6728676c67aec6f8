"""Quality filters: each rule drops a document made to break it and keeps English prose; the
prepare step counts each drop by rule with example names; C4's line rules change the text that
both passes use; the defaults keep the python-stdlib demo whole."""

import dataclasses

import pytest

from data_prep.config import C4Config, DataConfig, FineWebConfig, GopherConfig, QualityConfig, RepetitionConfig
from data_prep.filters import filtered_text
from data_prep.manifest import load_manifest
from data_prep.prepare import prepare_dataset, scan_corpus
from data_prep.quality import quality_problem
from storage import open_store
from tests.helpers import english_docs, tiny_data, tiny_tokenizer, write_corpus

PROSE = english_docs(1, seed=1)[0]
OFF = RepetitionConfig(enabled=False)


def gopher() -> QualityConfig:
    return QualityConfig(gopher=GopherConfig(enabled=True), repetition=OFF)


def repetition(**one_rule) -> QualityConfig:
    """Only the given repetition rule(s), at Gopher's thresholds."""
    none = dict(max_dup_paragraph_chars=0.0, max_dup_line_chars=0.0, max_top_ngram_chars=[0.0] * 3, max_dup_ngram_chars=[0.0] * 6)
    return QualityConfig(repetition=RepetitionConfig(**(none | one_rule)))


def c4() -> QualityConfig:
    return QualityConfig(c4=C4Config(enabled=True), repetition=OFF)


def fineweb() -> QualityConfig:
    return QualityConfig(fineweb=FineWebConfig(enabled=True), repetition=OFF)


def lines(template: str, n: int) -> str:
    return "\n".join(template.format(i=i, w=chr(97 + i % 26) * (3 + i % 5)) for i in range(n))


REPEATED = "The same long sentence about the river and the garden, repeated many times over."
CASES = {
    "gopher_words": (gopher(), "The river and the garden of the village."),
    "gopher_word_length": (gopher(), "the of and " + " ".join(f"extraordinarily{i}lengthy" for i in range(60))),
    "gopher_symbols": (gopher(), PROSE + " " + " ".join(f"#tag{i}" for i in range(30))),
    "gopher_bullets": (gopher(), lines("- the {w} of the river and the garden {i}", 60)),
    "gopher_ellipsis": (gopher(), PROSE.replace(".", "...")),
    "gopher_alpha": (gopher(), PROSE + " " + " ".join(str(1000 + i) for i in range(120))),
    "gopher_stop_words": (gopher(), " ".join(f"lorem ipsum dolor sit amet consectetur adipiscing elit{i}" for i in range(10))),
    "rep_dup_paragraphs": (repetition(max_dup_paragraphs=0.3), "\n\n".join([PROSE, "A note.", PROSE])),
    "rep_dup_paragraph_chars": (repetition(max_dup_paragraph_chars=0.2), f"{PROSE}\n\n{PROSE}"),
    "rep_dup_lines": (repetition(max_dup_lines=0.3), "\n".join([PROSE] + ["Short and repeated."] * 10)),
    "rep_dup_line_chars": (repetition(max_dup_line_chars=0.2), "\n".join([PROSE] + [REPEATED] * 4)),
    "rep_top_2gram": (repetition(max_top_ngram_chars=[0.2, 0, 0]), PROSE + " river bank" * 60),
    "rep_top_3gram": (repetition(max_top_ngram_chars=[0, 0.18, 0]), PROSE + " the river bank" * 50),
    "rep_top_4gram": (repetition(max_top_ngram_chars=[0, 0, 0.16]), PROSE + " by the river bank" * 40),
    **{
        f"rep_dup_{n}gram": (
            repetition(max_dup_ngram_chars=[0.15 if k == n else 0 for k in range(5, 11)]),
            PROSE + (" " + " ".join(f"word{k}" for k in range(n))) * 12,
        )
        for n in range(5, 11)
    },
    "c4_lorem_ipsum": (c4(), PROSE + "\nLorem ipsum dolor sit amet, in the garden."),
    "c4_curly_bracket": (c4(), PROSE + "\nThe value of the field is {name} in the garden."),
    "c4_sentences": (c4(), "\n".join(PROSE.splitlines()[:4])),
    "fineweb_line_punct": (fineweb(), lines("this line of the garden has no final punctuation mark {i}", 12)),
    "fineweb_short_lines": (fineweb(), lines("Short {w} line {i}.", 12)),
    "fineweb_dup_line_chars": (fineweb(), PROSE + "\n" + REPEATED + "\n" + REPEATED),
    "fineweb_newlines": (fineweb(), lines("Extraordinarilylengthyword{i}{w}.", 12)),
}


@pytest.mark.parametrize("rule", sorted(CASES))
def test_each_rule_drops_its_document_and_keeps_prose(rule):
    config, bad = CASES[rule]
    assert quality_problem(bad, config)[0] == rule
    assert quality_problem(PROSE, config) == ("", PROSE)


def test_stop_words_are_counted_distinct_as_gopher_does():
    words = " ".join(f"lorem ipsum dolor sit amet elit{i}" for i in range(12))
    assert quality_problem(f"{words} the cat the dog", gopher())[0] == "gopher_stop_words"  # "the" twice is one
    assert quality_problem(f"{words} the cat and the dog", gopher())[0] == ""


def test_c4_removes_lines_and_both_passes_see_the_same_text():
    data = DataConfig(quality=c4(), min_chars=16)
    raw = PROSE + "\nA heading without punctuation\nEnable JavaScript in the browser to see the garden.\nToo short."
    text, reason, edits = filtered_text(raw, data)
    assert (text, reason, edits) == (PROSE, "", {"c4_lines_removed": 3})
    assert filtered_text(raw, data) == (text, reason, edits)  # the encode pass calls the same function


def test_prepare_counts_each_rule_with_examples(tmp_path):
    config = QualityConfig(gopher=GopherConfig(enabled=True), c4=C4Config(enabled=True), fineweb=FineWebConfig(enabled=True))
    docs = {f"good{i}.txt": text for i, text in enumerate(english_docs(24, seed=3))}
    docs |= {"bullets.txt": CASES["gopher_bullets"][1], "stop.txt": CASES["gopher_stop_words"][1]}
    lorem, heading = english_docs(2, seed=5)  # not PROSE: documents alike but for a line are near duplicates
    docs |= {"lorem.txt": lorem + "\nLorem ipsum dolor sit amet, in the garden.", "heading.txt": heading + "\nA heading"}
    data = tiny_data(sources=[str(write_corpus(tmp_path / "c", docs))], quality=config)
    store = open_store(str(tmp_path / "store"))
    ref = prepare_dataset(data, tiny_tokenizer(), store)
    manifest = load_manifest(store, ref)
    stats, examples = manifest["stats"], manifest["sources"]["skipped_examples"]
    assert {k: v for k, v in stats.items() if k.startswith("skipped_quality_")} == {
        "skipped_quality_gopher_bullets": 1,
        "skipped_quality_gopher_stop_words": 1,
        "skipped_quality_c4_lorem_ipsum": 1,
    }
    assert examples["quality_gopher_bullets"] == ["bullets.txt"] and examples["quality_c4_lorem_ipsum"] == ["lorem.txt"]
    assert stats["documents_kept"] == 25 and stats["c4_lines_removed"] == 1
    assert manifest["config"]["data"]["quality"]["c4"]["enabled"] is True
    # A changed threshold is another dataset.
    looser = dataclasses.replace(config, c4=C4Config(enabled=True, lorem_ipsum=False))
    other = prepare_dataset(dataclasses.replace(data, quality=looser), tiny_tokenizer(), store)
    assert other.version != ref.version and other.stats["documents_kept"] == 26


def test_defaults_keep_the_stdlib_demo_whole(tmp_path):
    data = DataConfig(near_dedup=False, workers=2)
    resolution = scan_corpus(data, open_store(str(tmp_path)))
    assert resolution.kept > 500
    assert not [reason for reason in resolution.skips if reason.startswith(("quality_", "pii_", "language"))]
