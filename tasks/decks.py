"""HTML for Flyte Decks: self-contained (no CDN assets, no scripts), every value escaped; the Decks
every task may show. The training run's charts and comparisons are in ``tasks.run_decks``, which
data tasks do not import (their cache keys stay clear of the training code)."""

from __future__ import annotations

from html import escape

from flytekit.deck import DeckField

# flytekit's default Decks less three. "Dependencies" runs `pip list` and `pip freeze` after each task
# (1–2 s and 4 s of CPU each, for five tasks a run); each task's cache key already names the versions of
# the libraries it imports (common.codeversion). "Input" and "Output" render values with str(), unescaped:
# a launch-form setting such as evaluation.prompt, or text the model generated, became HTML that runs in
# whoever opens the Deck. Our own Decks escape every value (``table``).
FIELDS = (DeckField.SOURCE_CODE, DeckField.TIMELINE)

STYLE = (
    "<style>body{font-family:sans-serif} table{border-collapse:collapse}"
    " td,th{border:1px solid #ccc;padding:3px 8px;text-align:left} pre{background:#f6f6f6;padding:8px}</style>"
)


def table(rows: dict[str, object], title: str) -> str:
    body = "".join(f"<tr><th>{escape(str(k))}</th><td>{escape(fmt(v))}</td></tr>" for k, v in rows.items())
    return f"{STYLE}<h3>{escape(title)}</h3><table>{body}</table>"


def fmt(value: object) -> str:
    return f"{value:.4g}" if isinstance(value, float) else str(value)
