"""Issue 51 items 6-8: ``run`` and ``check`` take ``--store``; ``check`` refuses a corpus ``run`` would refuse,
through the same listing; and that refusal advises what applies to the settings in use."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from cli.main import _config, main, parser

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture
def isolated(tmp_path, monkeypatch) -> Path:
    """No $PRETRAIN_STORE, $PRETRAIN_CLUSTER or HOME of the machine's: the defaults of a fresh account."""
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.delenv("PRETRAIN_STORE", raising=False)
    monkeypatch.delenv("PRETRAIN_CLUSTER", raising=False)
    return tmp_path


def check(capsys, *argv: str) -> tuple[int, str, str]:
    capsys.readouterr()
    status = main(["check", *argv])
    captured = capsys.readouterr()
    return status, captured.out, captured.err


@pytest.mark.parametrize("command", ["run", "check"])
def test_store_option_sets_the_configs_store_and_the_preset_wins_over_the_environment(command, isolated, monkeypatch):
    preset = isolated / "preset.yaml"
    preset.write_text(yaml.safe_dump({"store": str(isolated / "preset-store")}))
    monkeypatch.setenv("PRETRAIN_STORE", str(isolated / "env-store"))

    def store(*argv: str) -> str:
        return _config(parser().parse_args([command, *argv])).store

    assert store("--config", str(preset)) == str(isolated / "preset-store")  # not $PRETRAIN_STORE
    assert store("--config", str(preset), "--store", "s3://bucket/flag") == "s3://bucket/flag"
    assert store("--store", "/flag: a folder") == "/flag: a folder"  # taken as it is, not read as YAML
    assert store("--set", "store=/set", "--store", "/flag") == "/flag"  # the flag, given last
    assert store() == ""  # the config's '' = $PRETRAIN_STORE, when the run opens it


@pytest.mark.parametrize("command", ["run", "check"])
def test_the_store_option_is_in_the_help(command, capsys):
    with pytest.raises(SystemExit):
        main([command, "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "--store URI" in text and "(default: the config's store, else $PRETRAIN_STORE" in text


def test_check_refuses_a_bad_store_option(isolated, capsys):
    status, _, err = check(capsys, "--store", "ftp://host/x")
    assert status == 2 and "store is 'ftp://host/x': use a local path or s3://bucket/prefix" in err


def test_check_refuses_an_empty_corpus_folder_as_run_does(isolated, capsys):
    empty = isolated / "empty"
    empty.mkdir()
    status, out, err = check(capsys, "--set", f"data.sources=[{empty}]")
    assert status == 2 and out == ""
    assert err.startswith(f"error: the corpus sources ['{empty}'] hold no file to read (no files at all)")
    assert list(isolated.iterdir()) == [empty] and not list(empty.iterdir()), "check wrote something"

    (empty / "a.txt").write_text("text to read " * 10)
    status, out, _ = check(capsys, "--set", f"data.sources=[{empty}]")
    assert status == 0 and out.startswith("ok: ")


def test_check_refuses_a_mixture_component_with_nothing_to_read(isolated, capsys):
    empty = isolated / "empty"
    empty.mkdir()
    preset = isolated / "mixture.yaml"
    mixture = [{"name": "code", "sources": ["python-stdlib"]}, {"name": "docs", "sources": [str(empty)]}]
    preset.write_text(yaml.safe_dump({"data": {"sources": [], "mixture": mixture}}))
    status, _, err = check(capsys, "--config", str(preset))
    assert status == 2 and f"['{empty}'] hold no file to read" in err


def test_check_leaves_s3_sources_to_the_run(isolated, capsys, monkeypatch):
    """A check stays local: a bucket's files are listed by the run (no credentials or network needed here)."""
    import data_prep.sources

    monkeypatch.setattr(data_prep.sources, "_s3_files", lambda *a: pytest.fail("check listed an S3 source"))
    status, out, err = check(capsys, "--set", "data.sources=[s3://bucket/corpus/]")
    assert status == 0, err


def test_the_refusal_suggests_sniffing_only_when_it_is_off(isolated, capsys):
    binary = isolated / "binary"
    binary.mkdir()
    (binary / "weights.bin").write_bytes(bytes(range(256)) * 4)
    status, _, err = check(capsys, "--set", f"data.sources=[{binary}]")
    assert status == 2 and "1 ignored as .bin" in err
    assert "data.sniff_unlisted: true" not in err  # already the default: advice that changes nothing
    assert "UTF-8" in err  # what it read them for, and why these were not read
    status, _, err = check(capsys, "--set", f"data.sources=[{binary}]", "--set", "data.sniff_unlisted=false")
    assert status == 2 and "set data.sniff_unlisted: true" in err
