"""The CLI a newcomer reads (issue 33, item 2): every option described with its default, one model grammar,
and no torch, Flyte or MLflow import on the help and store-reading paths (what made them take 3-8 s)."""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

import pytest

from cli.main import MODEL_SPEC, parser

HEAVY = ("torch", "flytekit", "megatron", "mlflow", "great_expectations", "webdataset", "transformers", "lm_eval")


def commands(p: argparse.ArgumentParser, path: tuple[str, ...] = ()) -> list[tuple[tuple[str, ...], argparse.ArgumentParser]]:
    """Every command and subcommand parser, with its words (``("registry", "show")``)."""
    found = [(path, p)]
    for action in p._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, child in action.choices.items():
                found += commands(child, (*path, name))
    return found


def test_every_option_says_what_it_is_and_its_default():
    missing, no_default = [], []
    for path, p in commands(parser()):
        text = " ".join(p.format_help().split())
        for action in p._actions:
            if isinstance(action, (argparse._HelpAction, argparse._SubParsersAction)):
                continue
            label = f"pretrain {' '.join(path)} {'/'.join(action.option_strings) or action.dest}"
            if not action.help:
                missing.append(label)
            empty = action.default in (None, "", [], argparse.SUPPRESS) or action.default is False
            if action.option_strings and not empty and f"(default: {action.default})" not in text:
                no_default.append(label)
    assert not missing, f"options without a description: {missing}"
    assert not no_default, f"options whose help hides their default: {no_default}"


def test_one_grammar_for_a_model():
    by_command = {path: p for path, p in commands(parser())}
    for path in [("registry", "show"), ("registry", "download"), ("tracking", "sync")]:
        (model,) = [a for a in by_command[path]._actions if a.dest == "model"]
        assert model.metavar == MODEL_SPEC == "NAME[:VERSION|:ALIAS]", path


QUICK = [["--help"], ["run", "--help"], ["check", "--help"], ["runs", "list"], ["registry", "list"], ["gc"]]
QUICK += [["registry", "show", "m"]]  # a model the empty store does not have: the error path too


@pytest.mark.parametrize("argv", QUICK, ids=lambda argv: " ".join(argv))
def test_help_and_store_reads_import_no_heavy_library(argv, tmp_path):
    """Measured by what is imported, not by time: a time limit would fail on a loaded machine, an import
    of torch (2-3 s) or MLflow shows on any machine."""
    probe = (
        "import atexit, json, sys\n"
        f"atexit.register(lambda: print(json.dumps([m for m in {HEAVY!r} if m in sys.modules]), file=sys.stderr))\n"
        "from cli.main import main\n"
        f"sys.exit(main({argv!r} + ([] if '--help' in {argv!r} else ['--store', {str(tmp_path / 'store')!r}])))\n"
    )
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120)
    assert done.returncode in (0, 2), done.stderr[-2000:]  # 2: `registry show x` of an empty store, a user error
    imported = json.loads(done.stderr.strip().splitlines()[-1])
    assert imported == [], f"pretrain {' '.join(argv)} imported {imported}"


def test_set_overrides_one_setting_and_is_checked_like_the_preset(capsys):
    from cli.main import main

    preset = str(Path(__file__).parents[1] / "configs" / "tiny-cpu.yaml")
    assert main(["check", "--config", preset, "--set", "train.steps=7", "--set", "data.seq_len=64"]) == 0
    budget = "; 7 steps of 16 × 64 tokens = 7,168 tokens; cosine schedule, 20 warm-up steps"
    assert capsys.readouterr().out.rstrip().endswith(budget)
    assert main(["check", "--set", "train.stpes=7", "--set", "train.lr=fast"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: the settings in the defaults with --set train.stpes=7 --set train.lr=fast have 2 problems:")
    assert "unknown setting train.stpes (did you mean train.steps?)" in err and "train.lr must be float, got 'fast'" in err
    assert main(["check", "--set", "steps"]) == 2
    assert "write KEY=VALUE with a dotted key, e.g. --set train.steps=10" in capsys.readouterr().err
