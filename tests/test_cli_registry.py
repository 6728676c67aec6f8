"""Issue 51 items 10-11: ``registry promote`` compares the version with the one the alias names and refuses a
worse one unless ``--force``; ``registry show`` prints figures for people and only the model's files."""

from __future__ import annotations

import json
import math
from dataclasses import replace

import pytest

from cli.main import main
from registry.aliases import read_alias
from registry.registry import promote, register
from storage import Store, open_store
from tests.helpers import registry_inputs, report

GOOD, BAD = 1.94 * math.log(2), 2.45 * math.log(2)
"""Validation losses whose bits per byte are 1.94 and 2.45 (``report``: bits per byte = loss / ln 2)."""


@pytest.fixture
def store(tmp_path) -> Store:
    """A local store with two versions of gpt: 1 good (1.94 bits per byte), 2 worse (2.45)."""
    store = registry_inputs(open_store(str(tmp_path / "store")))
    register(store, "gpt", report(GOOD))
    register(store, "gpt", report(BAD))
    return store


def pretrain(capsys, *argv: str) -> tuple[int, str, str]:
    capsys.readouterr()
    status = main(list(argv))
    captured = capsys.readouterr()
    return status, captured.out, captured.err


def production(store: Store) -> int | None:
    return read_alias(store, "gpt", "production")[0]


def test_promote_refuses_a_worse_version_saying_both_figures(store, capsys):
    status, out, _ = pretrain(capsys, "registry", "promote", "gpt:1", "--store", store.uri)
    assert status == 0 and out.splitlines()[0] == "gpt:production -> version 1 (production named no version before)"

    status, out, err = pretrain(capsys, "registry", "promote", "gpt:2", "--store", store.uri)
    assert status == 2 and out == ""
    assert err == (
        "error: gpt:2 (bits_per_byte 2.4500) is worse than gpt:1 (bits_per_byte 1.9400), which production names "
        "(lower is better); production left on version 1: add --force to move it anyway\n"
    )
    assert production(store) == 1


def test_promote_force_moves_it_and_says_so(store, capsys):
    promote(store, "gpt:1", "production")
    status, out, _ = pretrain(capsys, "registry", "promote", "gpt:2", "--force", "--store", store.uri)
    assert status == 0 and production(store) == 2
    assert out.splitlines()[0] == (
        "gpt:production -> version 2 (bits_per_byte 2.4500), replacing version 1 (bits_per_byte 1.9400), "
        "which is better: moved by --force"
    )


def test_promote_of_a_better_or_equal_version_says_what_it_replaced(store, capsys):
    promote(store, "gpt:2", "production")
    status, out, _ = pretrain(capsys, "registry", "promote", "gpt:1", "--store", store.uri)
    assert status == 0 and production(store) == 1
    assert out.splitlines()[0] == (
        "gpt:production -> version 1 (bits_per_byte 1.9400), replacing version 2 (bits_per_byte 2.4500)"
    )
    register(store, "gpt", report(GOOD), config={"again": True})  # version 3, as good as 1: promoted
    assert pretrain(capsys, "registry", "promote", "gpt:3", "--store", store.uri)[0] == 0 and production(store) == 3
    status, out, _ = pretrain(capsys, "registry", "promote", "gpt:3", "--store", store.uri)
    assert status == 0 and out.splitlines()[0] == "gpt:production already names version 3"


def test_promote_says_when_the_figures_are_not_on_the_same_data(store, capsys):
    promote(store, "gpt:1", "production")
    card = store.get_json("models/gpt/2/card.json")
    card["lineage"]["dataset_version"] = "other"  # as a version trained and evaluated on another dataset records it
    store.put_json("models/gpt/2/card.json", card)
    status, _, err = pretrain(capsys, "registry", "promote", "gpt:2", "--store", store.uri)
    assert status == 2 and "; measured on different validation data (datasets other and " in err


def test_the_library_promote_moves_the_alias_unless_asked_to_refuse(store):
    promote(store, "gpt:1", "production")
    done = promote(store, "gpt:2", "production")  # the pipeline's and the tests' callers: unconditional, as before
    assert production(store) == 2 and done.worse and (done.replaced, done.metric) == (1, "bits_per_byte")


def test_show_prints_figures_for_people_and_only_the_models_files(store, capsys):
    counted = report(3.0)
    summary = {"tokens_per_second": 3502.7253, "parameters": 1901696.0, "tokens_trained": 81920.0, "mfu": 0.2246}
    register(store, "gpt", replace(counted, checkpoint=replace(counted.checkpoint, summary=summary)), config={"again": True})
    status, out, _ = pretrain(capsys, "registry", "show", "gpt:3", "--store", store.uri)
    assert status == 0
    shown = {line.split()[0]: line.split()[1:] for line in out.splitlines() if line.startswith("  ") and len(line.split()) > 1}
    assert shown["tokens_per_second"] == ["3,503"] and shown["parameters"] == ["1,901,696"]
    assert shown["tokens_trained"] == ["81,920"] and shown["mfu"] == ["0.2246"] and shown["val_loss"] == ["3.0000"]
    files = out.split("\nfiles:\n", 1)[1].split()
    assert files and all("/models/gpt/3/" in f for f in files)
    assert not [f for f in files if f.endswith(("/_CLAIMED", "/_COMMITTED"))], files
    status, out, _ = pretrain(capsys, "registry", "show", "gpt:3", "--json", "--store", store.uri)
    assert not [f for f in json.loads(out)["files"] if f.endswith(("/_CLAIMED", "/_COMMITTED"))]
