"""Issue 19, item 4: alias moves are conditional on the alias's ETag, and the quality gate
decides against the holder of the alias when it moves it, never against a stale one. Two
registrations racing for ``production`` never leave the worse model there.

Each candidate here was evaluated against version 1 (``report.baseline``), as
``find_gate_holder`` → ``evaluate_model`` → ``register_model`` would have it; lower bits per
byte is better. Local store and the real SeaweedFS server (``store`` fixture)."""

from __future__ import annotations

import dataclasses
import logging
import random
import threading

import pytest

from registry import aliases as registry_aliases
from registry.registry import register, resolve, show
from storage import open_store
from tests.helpers import registry_inputs, report

EVALUATION = {"evaluation": {"batch_size": 16, "max_batches": 16}}
"""The row settings every registration here was evaluated with: their cards' figures compare."""


def candidate(loss: float, baseline: str = "models/gpt/1", baseline_loss: float = 3.0):
    """A report on a candidate of val loss ``loss``, compared during evaluation with ``baseline``."""
    r = report(loss)
    return dataclasses.replace(r, baseline=baseline, baseline_bits_per_byte=report(baseline_loss).bits_per_byte)


def gated(store, r, config=EVALUATION, name="gpt"):
    return register(store, name, r, config=config, gate_alias="production", gate_tolerance=0.0)


@pytest.fixture
def holder(store):
    """gpt:1 (loss 3.0) holds production: the first model of the name takes the alias."""
    registry_inputs(store)
    gated(store, report(3.0))
    assert resolve(store, "gpt:production") == ("gpt", 1)
    return store


@pytest.mark.slow
def test_the_gate_compares_with_the_holder_the_evaluation_saw(holder):
    store = holder
    ref = gated(store, candidate(2.0))
    assert resolve(store, "gpt:production") == ("gpt", ref.version)
    gate = show(store, f"gpt:{ref.version}").card.gate
    assert gate.baseline == "models/gpt/1" and gate.promoted and gate.reason.endswith("promoted")
    worse = gated(store, candidate(2.5, baseline="models/gpt/2", baseline_loss=2.0))
    assert not show(store, f"gpt:{worse.version}").card.gate.promoted
    assert resolve(store, "gpt:production") == ("gpt", 2) and resolve(store, "gpt") == ("gpt", 3)


def test_holder_moved_during_evaluation_to_a_better_model_keeps_it(holder):
    """B (2.0) and A (2.5) were both evaluated against gpt:1 (3.0); B registered first and took
    production. A, better than gpt:1 but worse than B, must not take it from B."""
    store = holder
    b = gated(store, candidate(2.0))
    a = gated(store, candidate(2.5))
    assert resolve(store, "gpt:production") == ("gpt", b.version)
    gate = show(store, f"gpt:{a.version}").card.gate
    assert not gate.promoted and gate.baseline == f"models/gpt/{b.version}"
    assert gate.baseline_bits_per_byte == pytest.approx(report(2.0).bits_per_byte)
    assert gate.reason.startswith(f"holder changed during evaluation (models/gpt/1 then, models/gpt/{b.version} now")
    assert gate.reason.endswith("alias kept")


def test_holder_moved_during_evaluation_to_a_worse_model_is_replaced(holder):
    store = holder
    b = gated(store, candidate(2.5))
    a = gated(store, candidate(2.0))
    assert resolve(store, "gpt:production") == ("gpt", a.version)
    gate = show(store, f"gpt:{a.version}").card.gate
    assert gate.promoted and gate.baseline == f"models/gpt/{b.version}"


@pytest.mark.parametrize(
    "theirs",
    [
        {"evaluation": {"batch_size": 8, "max_batches": 16}},  # other rows
        {},  # rows not recorded
    ],
)
def test_holder_moved_to_a_model_scored_on_other_rows_keeps_the_alias(holder, theirs):
    store = holder
    b = gated(store, candidate(2.9), config=theirs)
    assert resolve(store, "gpt:production") == ("gpt", b.version)
    a = gated(store, candidate(1.0))  # much better, but not on comparable figures
    gate = show(store, f"gpt:{a.version}").card.gate
    assert not gate.promoted and gate.baseline_bits_per_byte is None
    assert gate.reason.startswith("holder changed during evaluation: alias kept, re-run to compare")
    assert resolve(store, "gpt:production") == ("gpt", b.version)


def test_alias_moved_between_the_decision_and_the_move(holder, monkeypatch, caplog):
    """The narrowest window: A decided against gpt:1 (and its card says so); while A's version
    is committed, B (better) takes production. A's conditional move fails on the changed ETag,
    A decides again against B and keeps B there."""
    store = holder
    b_report = candidate(2.0)
    real_commit = type(store).commit
    moved = []

    def commit(self, prefix, info=None):
        real_commit(self, prefix, info)
        if prefix == "models/gpt/2" and not moved:  # A's own commit: B slips in now
            moved.append(gated(open_store(store.uri), b_report))

    monkeypatch.setattr(type(store), "commit", commit)
    with caplog.at_level(logging.WARNING, logger="registry.registry"):
        a = gated(store, candidate(2.5))
    (b,) = moved
    assert (a.version, b.version) == (2, 3)
    assert resolve(store, "gpt:production") == ("gpt", b.version)
    assert show(store, "gpt:2").card.gate.promoted  # the card's decision against gpt:1 ...
    assert "gpt:production moved to models/gpt/3 while gpt:2 was registered" in caplog.text  # ... not applied
    assert resolve(store, "gpt") == ("gpt", 3)  # latest did not move back to 2


def test_racing_registrations_leave_the_best_on_production(holder):
    """Four registrations, each evaluated against gpt:1, run at once (one client each, as
    separate workers would have): production ends on the best, latest on the newest."""
    store = holder
    losses = [2.6, 2.2, 2.8, 2.4]
    random.Random(0).shuffle(losses)
    start = threading.Barrier(len(losses))
    refs = {}

    def run(loss: float) -> None:
        client = open_store(store.uri)
        start.wait()
        refs[loss] = gated(client, candidate(loss))

    threads = [threading.Thread(target=run, args=(loss,)) for loss in losses]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(refs) == len(losses)
    assert resolve(store, "gpt:production") == ("gpt", refs[min(losses)].version)
    assert resolve(store, "gpt") == ("gpt", 1 + len(losses))


@pytest.mark.slow
def test_alias_writes_lose_no_update(store):
    """Many promotions at once through the registry's own conditional move: each increments a
    counter it reads in ``decide``; none is lost."""
    registry_inputs(store)
    for loss in (3.0, 2.0, 1.0):
        register(store, "gpt", report(loss))
    decided = []

    def bump(client, i):
        def decide(holder):
            return (holder or 0) % 3 + 1

        decided.append(registry_aliases.move_alias(client, "gpt", "rr", decide))

    clients = [open_store(store.uri) for _ in range(6)]
    threads = [threading.Thread(target=bump, args=(clients[i], i)) for i in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    # six successful moves of 1 → 2 → 3 → 1 …: the alias went round twice, back to where it started
    assert sorted(decided) == [1, 1, 2, 2, 3, 3] and resolve(store, "gpt:rr") == ("gpt", 3)
