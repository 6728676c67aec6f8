"""The CLI a newcomer reads (issue 33, item 2): every option described with its default, one model grammar,
and no torch, Flyte or MLflow import on the help and store-reading paths (what made them take 3-8 s)."""

from __future__ import annotations

import argparse
import json
import subprocess
import sys

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
            worth_saying = action.default not in (None, "", argparse.SUPPRESS) and action.default is not False
            if action.option_strings and worth_saying and f"(default: {action.default})" not in text:
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
