"""Which cached tasks run again after an edit: each task's cache version and the run id's code
key are derived from the import closure of its module (``common.codeversion``), computed
here on a temporary copy of the source tree, one edit (an appended comment) at a time.

``changed`` is what the derived keys say: the tasks whose cache version changed, and ``run id``
when the code key in ``training.train.run_id`` changed. ``reruns`` adds what follows from
the inputs: a new run id names a new run, so train's CheckpointRef changes, evaluate's
EvalReport (which names that run) changes, and register reruns on it although its own
version is the same. A comment changes no bytes that prepare writes, and the DatasetRef is
content-addressed, so a data edit adds nothing downstream beyond its own versions. (An edit
that changes behaviour may change more outputs, and with them more inputs downstream.)

The table is ``tests/helpers.CACHE_KEY_TABLE``. Its ``reruns`` column is a model of Flyte's cache,
checked against real local executions run from an edited copy of the tree: every row, one edit a
run, by ``benchmarks/cache_key_table.py`` (outside the suite; its result is in benchmarks/results/);
in the suite, by ``tests/test_workflow_e2e.py``, five rows: ``cli/main.py`` as the run's only edit
(nothing reruns), and one edit per cached task in two runs (``data_prep/clean.py`` with
``evaluation/lm_eval_tasks/heldout_cloze.yaml``, ``reports/run_html.py`` with ``registry/registry.py``).

Run with ``-s`` to see the table.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from common import codeversion
from common.codeversion import FIRST_PARTY, PROJECT_ROOT, closure, code_version
from tests.helpers import ALL_TASKS as ALL
from tests.helpers import CACHE_KEY_TABLE as EXPECTED

TASK_MODULES = {
    "prepare": "tasks.data",
    "validate": "tasks.data",
    "train": "tasks.train",
    "evaluate": "tasks.evaluate",
    "register": "tasks.register",
}
RUN_ID_MODULE = "training.train"  # run_id hashes code_version("training.train")
ORDER = [*TASK_MODULES, "run id"]


@pytest.fixture(scope="module")
def tree(tmp_path_factory) -> Path:
    """A copy of the source packages, nothing else."""
    root = tmp_path_factory.mktemp("tree")
    for package in sorted(FIRST_PARTY):
        shutil.copytree(PROJECT_ROOT / package, root / package, ignore=shutil.ignore_patterns("__pycache__"))
    return root


def keys(root: Path) -> dict[str, str]:
    found = {task: code_version(module, root) for task, module in TASK_MODULES.items()}
    found["run id"] = code_version(RUN_ID_MODULE, root)
    return found


def reruns(changed: set[str]) -> set[str]:
    tasks = changed & ALL
    if "run id" in changed:  # a new run: new CheckpointRef, new EvalReport
        tasks |= {"train", "evaluate", "register"}
    return tasks


@pytest.mark.slow
def test_each_edit_changes_exactly_the_expected_versions(tree, tmp_path):
    baseline = keys(tree)
    assert keys(shutil.copytree(tree, tmp_path / "elsewhere")) == baseline, "keys must not depend on where the tree is"
    rows = {}
    for edited in EXPECTED:
        path = tree / edited
        original = path.read_bytes()
        path.write_bytes(original + b"\n# an edit\n")
        try:
            after = keys(tree)
        finally:
            path.write_bytes(original)
        changed = {name for name in ORDER if after[name] != baseline[name]}
        rows[edited] = (changed, reruns(changed))
    assert keys(tree) == baseline

    def names(items: set[str]) -> str:
        return ", ".join(n for n in ORDER if n in items) or "-"

    width = max(map(len, EXPECTED))
    print(f"\n{'file edited':<{width}} | {'versions changed':<52} | reruns")
    for edited, (changed, rerun) in rows.items():
        print(f"{edited:<{width}} | {names(changed):<52} | {names(rerun)}")
    assert rows == EXPECTED


def test_closures_keep_their_layers():
    closures = {module: closure(module) for module in {*TASK_MODULES.values(), RUN_ID_MODULE}}
    for module, found in closures.items():
        assert "cli.main" not in found.modules, f"{module} reaches the CLI: a CLI edit would rerun it"
        assert "workflows" not in found.modules, module
    register = closures["tasks.register"]
    assert {m for m in register.modules if m.startswith(("training", "evaluation"))} == {
        "training",
        "training.known_warnings",  # the package's import filters megatron's warnings: no torch, a few lines
        "training.config",
        "evaluation",
        "evaluation.config",
        "evaluation.lm_eval_catalog",
    }
    assert not {"torch", "megatron", "triton"} & register.third_party
    assert not {"torch", "megatron"} & closures["tasks.data"].third_party
    # Training, evaluation and registration read a dataset (its manifest, shards and tokenizer), never
    # the code that made it: an edit to a filter, dedup, the encoder, validation or the corpus listing
    # (data_prep.sources: DataError has a module of its own) reruns no training.
    # data_prep.blend: a mixture's order and its manifest's components, read (data_prep.blend_dataset writes it).
    reader = {"data_prep", "data_prep.blend", "data_prep.config", "data_prep.errors", "data_prep.manifest", "data_prep.shards"}
    for module in ("tasks.train", "tasks.evaluate", "tasks.register"):
        assert {m for m in closures[module].modules if m.startswith("data_prep")} <= reader, module
    # And the data tasks reach no training code, nor the charts of a run.
    assert not {m for m in closures["tasks.data"].modules if m.startswith(("training", "reports.charts"))}
    # The run id's code is part of train's: a change that moves the run id reruns train.
    assert set(closures[RUN_ID_MODULE].modules) <= set(closures["tasks.train"].modules)
    print()
    for module, found in sorted(closures.items()):
        print(f"{module}: {len(found.modules)} modules; libraries {sorted(codeversion.library_versions(found.third_party))}")


@pytest.mark.slow
def test_library_versions_are_part_of_the_key(monkeypatch):
    before = {module: code_version(module) for module in ("tasks.data", "tasks.train", "tasks.register")}
    installed = codeversion.distribution_version

    def upgraded(dist: str, new: str):
        monkeypatch.setattr(codeversion, "distribution_version", lambda d: new if d == dist else installed(d))
        return {module: code_version(module) for module in before}

    torch = upgraded("torch", "99.0")
    assert torch["tasks.train"] != before["tasks.train"]
    assert torch["tasks.data"] == before["tasks.data"] and torch["tasks.register"] == before["tasks.register"]

    tokenizers = upgraded("tokenizers", "99.0")
    assert tokenizers["tasks.data"] != before["tasks.data"]
    # Training reads token ids from shards, and registration copies the dataset's tokenizer.json as bytes (its
    # digest checked): no tokenizers code runs in either, so an upgrade keeps their entries.
    assert tokenizers["tasks.train"] == before["tasks.train"] and tokenizers["tasks.register"] == before["tasks.register"]

    # An orchestration library decides no number: an upgrade keeps every cache entry.
    assert upgraded("flytekit", "99.0") == before
