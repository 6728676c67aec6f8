"""The Decks every task shows besides its own: flytekit's, less three. Our own Decks are HTML made by
``pipeline`` (``deck_html``: style and tables; ``run_html``: a training run's; ``dataset_html``: a dataset's),
self-contained (no CDN assets, no scripts), every value escaped, and shared with ``pretrain runs report``."""

from __future__ import annotations

from flytekit.deck import DeckField

# flytekit's default Decks less three. "Dependencies" runs `pip list` and `pip freeze` after each task
# (1–2 s and 4 s of CPU each, for five tasks a run); each task's cache key already names the versions of
# the libraries it imports (common.codeversion). "Input" and "Output" render values with str(), unescaped:
# a launch-form setting such as evaluation.prompt, or text the model generated, became HTML that runs in
# whoever opens the Deck. Our own Decks escape every value (``table``).
FIELDS = (DeckField.SOURCE_CODE, DeckField.TIMELINE)
