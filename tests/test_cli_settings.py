"""Issue 51 items 4-5: ``pretrain settings`` lists every setting of the config tree (its key, default and
description, from the config classes themselves), and ``--set`` takes one value for a list setting."""

from __future__ import annotations

import dataclasses
import json
import typing

from cli.main import main
from common.settings import documented_settings, listed, setting_type
from pipeline.config import PipelineConfig, with_overrides


def leaf_keys(cls: type, prefix: str = "") -> list[str]:
    """Every leaf setting's key, walked here apart from ``documented_settings`` (nested sections only)."""
    hints = typing.get_type_hints(cls)
    keys = []
    for f in dataclasses.fields(cls):
        if dataclasses.is_dataclass(hints[f.name]):
            keys += leaf_keys(hints[f.name], f"{prefix}{f.name}.")
        else:
            keys.append(f"{prefix}{f.name}")
    return keys


def test_settings_lists_every_setting_with_its_default_and_doc(capsys):
    assert main(["settings"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0].split() == ["KEY", "DEFAULT", "DESCRIPTION"]
    rows = {line.split()[0]: line for line in out[1:-1]}
    keys = leaf_keys(PipelineConfig)
    assert set(keys) <= set(rows) and len(keys) > 100
    assert rows["train.lr"].split(None, 2)[1:] == ["0.002", "Peak learning rate"]
    assert rows["store"].split(None, 2)[1] == "''"  # an empty string, visibly
    assert "one of: cosine, wsd" in rows["train.lr_schedule"]  # an Enum's choices
    assert "data.mixture[].weight" in rows  # the fields of a list's items
    assert out[-1].startswith(f"{len(rows)} settings; ")
    assert all(len(line.split(None, 2)) == 3 for line in out[1:-1]), "a setting without a description"


def test_settings_filters_by_section_key_or_word(capsys):
    assert main(["settings", "train"]) == 0
    keys = [line.split()[0] for line in capsys.readouterr().out.splitlines()[1:-1]]
    assert keys == [k for k in leaf_keys(PipelineConfig) if k.startswith("train.")]
    assert main(["settings", "sniff"]) == 0
    keys = [line.split()[0] for line in capsys.readouterr().out.splitlines()[1:-1]]
    assert keys == ["data.mixture[].sniff_unlisted", "data.sniff_unlisted"]
    assert main(["settings", "data.sniff_unlisted"]) == 0  # one setting: all of it
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == "data.sniff_unlisted: bool, default true" and "false ignores them, counted by suffix" in lines[1]
    assert main(["settings", "trian.lr"]) == 2
    assert capsys.readouterr().err.startswith("error: no setting 'trian.lr' (did you mean train.lr?)")


def test_settings_json_for_scripts(capsys):
    assert main(["settings", "--json", "data.sources"]) == 0
    (row,) = json.loads(capsys.readouterr().out)
    assert row["key"] == "data.sources" and row["default"] == ["python-stdlib"] and row["type"] == "list[str]"
    assert row["doc"].startswith("Corpus: local files, folders or globs")
    assert main(["settings", "--json", "data.normalization"]) == 0
    (row,) = json.loads(capsys.readouterr().out)
    assert row["default"] == "NFC" and row["choices"] == ["NFC", "NFKC", "NFD", "NFKD", "none"]


def test_the_listing_has_the_defaults_of_the_config_tree():
    defaults = PipelineConfig()
    for row in documented_settings(PipelineConfig, defaults):
        if "[]" in row.key:
            continue
        value = defaults
        for part in row.key.split("."):
            value = getattr(value, part)
        assert row.default == getattr(value, "value", value), row.key


def test_set_takes_one_value_for_a_list_setting(tmp_path):
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    (corpus / "a.txt").write_text("x" * 100)
    values = with_overrides({}, [f"data.sources={corpus}", "evaluation.lm_eval_tasks=heldout_cloze"])
    assert values["data"]["sources"] == [str(corpus)] and values["evaluation"]["lm_eval_tasks"] == ["heldout_cloze"]
    assert with_overrides({}, ["data.sources=[a, b]"])["data"]["sources"] == ["a", "b"]  # a list stays a list
    assert with_overrides({}, ["data.seq_len=64"])["data"]["seq_len"] == 64  # not a list setting: as it was
    assert listed(setting_type(PipelineConfig, ["data", "mixture"]), "x") == "x"  # a list of sections: the check says


def test_check_with_set_of_one_source_passes(tmp_path, capsys):
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    (corpus / "a.txt").write_text("some text " * 20)
    assert main(["check", "--set", f"data.sources={corpus}"]) == 0, capsys.readouterr().err
    assert capsys.readouterr().out.startswith("ok: the defaults")
