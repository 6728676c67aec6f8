"""Language identification: the allow-list drops prose in other languages (counted, with
examples), keeps code and undetermined text, and keeps the python-stdlib demo whole with [en]."""

from data_prep.config import DataConfig
from data_prep.language import code_share, identify, language_problem, looks_like_code
from data_prep.manifest import load_manifest
from data_prep.prepare import prepare_dataset, scan_corpus
from storage import open_store
from tests.helpers import english_docs, tiny_data, tiny_tokenizer, write_corpus

GERMAN = (
    "Der Fluss fließt langsam durch das kleine Dorf, und die Kinder spielen am Ufer, während ihre Eltern im Garten arbeiten. "
    "Am Abend sitzen alle zusammen am Tisch und erzählen Geschichten über den langen Winter."
)
FRENCH = (
    "La rivière coule lentement à travers le petit village, et les enfants jouent sur la rive pendant que leurs parents "
    "travaillent dans le jardin. Le soir, tout le monde se retrouve autour de la table pour raconter des histoires."
)
CODE = "".join(
    f'def scale_{i}(values, factor={i}):\n    """Times {i}."""\n    return [v * factor for v in values if v > {i}]  # ({i})\n'
    for i in range(4)
)


def test_identifies_prose_and_drops_what_is_not_allowed():
    english = english_docs(1)[0]
    assert identify(GERMAN)[0] == "de" and identify(FRENCH)[0] == "fr" and identify(english)[0] == "en"
    assert language_problem(GERMAN, ["en"], 0.5) == "language"
    assert language_problem(GERMAN, ["en", "de"], 0.5) == ""
    assert language_problem(english, ["en"], 0.5) == ""
    assert language_problem(GERMAN, [], 0.5) == ""  # no allow-list: nothing identified
    assert language_problem(GERMAN, ["en"], 1.01) == ""  # never confident enough: undetermined, kept


def test_code_is_kept_whatever_the_allow_list():
    assert looks_like_code(CODE) and not looks_like_code(GERMAN) and code_share(english_docs(1)[0]) < 0.03
    assert language_problem(CODE, ["de"], 0.5) == ""


def test_prepare_counts_language_drops_with_examples(tmp_path):
    docs = {f"en{i}.txt": text for i, text in enumerate(english_docs(20, seed=2))}
    docs |= {"de.txt": GERMAN, "fr.txt": FRENCH, "code.py": CODE}
    store = open_store(str(tmp_path / "store"))
    data = tiny_data(sources=[str(write_corpus(tmp_path / "c", docs))], languages=["en"])
    manifest = load_manifest(store, prepare_dataset(data, tiny_tokenizer(), store))
    assert manifest["stats"]["skipped_language"] == 2 and manifest["stats"]["documents_kept"] == 21
    assert sorted(manifest["sources"]["skipped_examples"]["language"]) == ["de.txt", "fr.txt"]


def test_english_only_keeps_the_stdlib_demo(tmp_path):
    data = DataConfig(near_dedup=False, workers=2, languages=["en"])
    resolution = scan_corpus(data, open_store(str(tmp_path)))
    assert resolution.kept > 500 and "language" not in resolution.skips


def test_allow_list_codes_are_checked():
    assert DataConfig(languages=["EN", "english"]).problems() == [
        "data.languages[0] is 'EN': give an ISO 639-1 code such as en, de, fr (or [] to keep all)",
        "data.languages[1] is 'english': give an ISO 639-1 code such as en, de, fr (or [] to keep all)",
    ]
