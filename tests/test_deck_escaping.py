"""No Deck renders a raw value (issue 32, item 4): flytekit's default Input and Output Decks wrote a
launch-form string such as ``evaluation.prompt`` into deck.html unescaped."""

from __future__ import annotations

from pathlib import Path

from flytekit import FlyteContextManager, task

from tasks import decks

PAYLOAD = "<img src=x onerror=alert(document.cookie)>"


@task(enable_deck=True, deck_fields=decks.FIELDS)
def echo(prompt: str) -> str:
    return prompt


def test_a_tasks_decks_hold_no_raw_input_or_output():
    sandbox = Path(FlyteContextManager.current_context().file_access.local_sandbox_dir)
    before = set(sandbox.rglob("deck.html"))
    assert echo(prompt=PAYLOAD) == PAYLOAD
    (deck,) = set(sandbox.rglob("deck.html")) - before
    html = deck.read_text()
    assert "<img src=x" not in html, "a value reached the Deck as HTML"
    assert "Timeline" in html  # the Decks that stay are there
