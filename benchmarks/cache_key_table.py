"""Every row of the cache-key table (``tests/helpers.CACHE_KEY_TABLE``), observed from real local executions.

    python benchmarks/cache_key_table.py [--rows FILE ...] [--work DIR] [--keep]

The table says, for a file edited, which cached tasks' keys change and which tasks rerun
(``tests/test_cache_keys.py`` derives the keys statically). Here each row is run: in a scratch copy
of the repository (its tracked and untracked, not ignored, files: the working tree is never
edited), ``pyflyte run workflows/pretrain.py pretrain --config run.yaml`` (the tiny preset of the
suite's pipelines, ``tests/helpers.write_config``, on a local store, with lm-eval on 16 examples of
each held-out task as in ``tests/test_workflow_e2e.py``) runs

1. cold, in a private HOME (flytekit's local cache is ``$HOME/.flyte/local-cache``): every cached
   task must miss;
2. again, unchanged: every cached task must hit (the control row, ``(no edit)``); the store, the
   cache and the MLflow database after it are the *warm state*;
3. once per row, from the warm state restored (so that no row sees another's cache entries,
   registry versions or gate alias), with a comment appended to the row's file in the copy
   (``\\n# an edit\\n``, as the suite's edits), the file restored afterwards, also on failure.

Which tasks ran is read from the local cache (a miss adds the task's new key:
``tests/helpers.cache_outcomes``), not from console output. Per row, checked: the tasks that
reran are the table's ``reruns``; a new training run (``runs/<id>``) appears exactly when the
table says the run id changes; a new registry version exactly when there is a new run (a register
rerun of the same evaluation replays its registration). Every pipeline must exit 0.

Last line of stdout: one JSON object (``rows``: file → expected and observed reruns, outcomes per
task, new run, new versions, seconds; ``mismatches``; ``machine``). Exit status 1 on any mismatch.
Run it with the project's Python (``.venv/bin/python``: its ``pyflyte`` runs the pipelines); the
whole table took about 6 minutes on the 2-core VM (16 pipelines, 9–40 s each).
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from machine_info import machine  # noqa: E402  (benchmarks/, the script's folder)
from soak import pin_code  # noqa: E402  (the working tree's files, tracked and untracked, not ignored)

from storage import open_store  # noqa: E402
from tests.helpers import (  # noqa: E402
    BIN,
    CACHE_KEY_TABLE,
    CACHED_STEPS,
    CACHED_TASKS,
    LM_EVAL_HELDOUT,
    cache_outcomes,
    distinct_corpus,
    init_tracking_db,
    local_cache_entries,
    write_config,
)

EDIT = b"\n# an edit\n"
NO_EDIT = "(no edit)"
MODEL = "gpt-e2e"  # write_config's registry.model_name


def names(items: set[str]) -> list[str]:
    return [step for step in (*CACHED_STEPS, "run id") if step in items]


class Pipelines:
    """One scratch folder: the tree copy, a corpus, a local store, a HOME, an MLflow database."""

    def __init__(self, work: Path) -> None:
        self.work = work
        self.tree = pin_code(work / "tree")
        self.store_dir = work / "store"
        self.home = work / "home"
        self.db = work / "mlflow.db"
        (work / "tmp").mkdir()
        corpus = distinct_corpus(work / "corpus")
        data = {"sources": [str(corpus)], "max_documents": 0}
        # lm-eval on, as in the suite's cold run and the presets: an evaluate rerun runs it too.
        self.config = write_config(work / "run.yaml", str(self.store_dir), data=data, evaluation=LM_EVAL_HELDOUT)
        self.settings = yaml.safe_load(self.config.read_text())  # reported, with the scratch folder's paths
        self.env = {
            **os.environ,
            "HOME": str(self.home),
            "PYTHONPATH": str(self.tree),  # the copy's modules, in every rank too
            "PYTHONUNBUFFERED": "1",
            "TMPDIR": str(work / "tmp"),  # flytekit's raw outputs and Decks: removed with the scratch folder
            "MLFLOW_TRACKING_URI": init_tracking_db(self.db),
        }

    def run(self) -> dict:
        """One ``pyflyte run`` of the config from the tree copy: each cached task's outcome, and what it added."""
        store = open_store(str(self.store_dir))
        runs, versions = self.runs(store), self.versions(store)
        before = local_cache_entries(self.home)
        started = time.monotonic()
        command = [str(BIN / "pyflyte"), "run", "workflows/pretrain.py", "pretrain", "--config", str(self.config)]
        result = subprocess.run(command, cwd=self.tree, env=self.env, capture_output=True, text=True, timeout=900)
        seconds = round(time.monotonic() - started, 1)
        if result.returncode != 0:
            return {"exit": result.returncode, "seconds": seconds, "output_tail": (result.stdout + result.stderr)[-3000:]}
        outcomes = cache_outcomes(before, local_cache_entries(self.home))
        return {
            "exit": 0,
            "seconds": seconds,
            "outcomes": {step: outcomes[task] for step, task in zip(CACHED_STEPS, CACHED_TASKS, strict=True)},
            "new_runs": len(self.runs(store) - runs),
            "new_versions": len(self.versions(store) - versions),
        }

    @staticmethod
    def runs(store) -> set[str]:
        return set(store.children("runs"))

    @staticmethod
    def versions(store) -> set[str]:
        return set(store.children(f"models/{MODEL}")) - {"aliases"}

    # The warm state: the store, flytekit's cache and the MLflow database after the unchanged rerun.
    def save_warm(self) -> None:
        for path in (self.store_dir, self.home, self.db):
            self._copy(path, self.work / "warm" / path.name)

    def restore_warm(self) -> None:
        for path in (self.store_dir, self.home, self.db):
            self._copy(self.work / "warm" / path.name, path)

    @staticmethod
    def _copy(source: Path, dest: Path) -> None:
        if dest.is_dir():
            shutil.rmtree(dest)
        dest.parent.mkdir(parents=True, exist_ok=True)
        (shutil.copytree if source.is_dir() else shutil.copy2)(source, dest)

    def edited_run(self, edited: str) -> dict:
        """A run from the warm state with a comment appended to ``edited`` in the copy (restored after)."""
        self.restore_warm()
        path = self.tree / edited
        original = path.read_bytes()
        path.write_bytes(original + EDIT)
        try:
            return self.run()
        finally:
            path.write_bytes(original)


def judge(observed: dict, keys: set[str], reruns: set[str]) -> tuple[dict, list[str]]:
    """The row's record and what in it disagrees with the table (``keys`` changed, ``reruns``)."""
    record = {"expected_reruns": names(reruns), "keys_changed": names(keys), **observed}
    if observed["exit"] != 0:
        return record, [f"the pipeline exited {observed['exit']}"]
    reran = {step for step, outcome in observed["outcomes"].items() if outcome == "miss"}
    record["observed_reruns"] = names(reran)
    wrong = []
    if reran != reruns:
        wrong.append(f"reran {names(reran) or '-'}, the table says {names(reruns) or '-'}")
    new_run = "run id" in keys
    if observed["new_runs"] != int(new_run):
        wrong.append(f"{observed['new_runs']} new training run(s), the table says the run id {'changes' if new_run else 'stays'}")
    if observed["new_versions"] != observed["new_runs"]:
        wrong.append(f"{observed['new_versions']} new registry version(s) for {observed['new_runs']} new run(s)")
    record["match"] = not wrong
    return record, wrong


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", nargs="+", default=list(CACHE_KEY_TABLE), help="only these rows (files) of the table")
    parser.add_argument("--work", type=Path, help="scratch folder (default: a new temporary one, removed unless --keep)")
    parser.add_argument("--keep", action="store_true", help="keep the scratch folder")
    args = parser.parse_args()
    unknown = [row for row in args.rows if row not in CACHE_KEY_TABLE]
    if unknown:
        parser.error(f"not rows of the table: {unknown}")

    started = time.monotonic()
    # The tree the copy is taken from (at the start: the working tree may change while this runs).
    commit = subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True).stdout.strip()
    dirty = bool(subprocess.run(["git", "status", "--porcelain"], cwd=ROOT, capture_output=True, text=True).stdout.strip())
    work = args.work or Path(tempfile.mkdtemp(prefix="cache-key-table-"))
    work.mkdir(parents=True, exist_ok=True)
    mismatches: dict[str, list[str]] = {}
    rows: dict[str, dict] = {}
    try:
        pipelines = Pipelines(work)
        cold = pipelines.run()
        print(f"cold run: {cold.get('outcomes')} in {cold['seconds']} s", flush=True)
        if cold["exit"] != 0 or set(cold["outcomes"].values()) != {"miss"}:
            raise SystemExit(f"the cold run did not run every cached task: {json.dumps(cold)}")
        for row in (NO_EDIT, *args.rows):  # the control first: its state is every row's start
            keys, reruns = CACHE_KEY_TABLE.get(row, (set(), set()))
            rows[row], wrong = judge(pipelines.run() if row == NO_EDIT else pipelines.edited_run(row), keys, reruns)
            if row == NO_EDIT:
                pipelines.save_warm()
            if wrong:
                mismatches[row] = wrong
            print(f"{row}: reran {rows[row].get('observed_reruns')} in {rows[row]['seconds']} s {'; '.join(wrong)}", flush=True)
        left = [edited for edited in args.rows if (pipelines.tree / edited).read_bytes() != (ROOT / edited).read_bytes()]
        if left:
            raise SystemExit(f"edited files not restored in the copy: {left}")
    finally:
        if not args.keep and not args.work:
            shutil.rmtree(work, ignore_errors=True)

    result = {
        "benchmark": "cache_key_table",
        "date": datetime.date.today().isoformat(),
        "commit": commit,
        "dirty": dirty,
        "command": "pyflyte run workflows/pretrain.py pretrain --config run.yaml",
        "config": pipelines.settings,
        "cold_s": cold["seconds"],
        "rows_checked": len(rows) - 1,
        "table_rows": len(CACHE_KEY_TABLE),
        "rows": rows,
        "mismatches": mismatches,
        "seconds": round(time.monotonic() - started, 1),
        "machine": machine(["flytekit", "torch"]),
    }
    print(json.dumps(result))
    sys.exit(1 if mismatches else 0)


if __name__ == "__main__":
    main()
