"""One tokenizer for a whole mixture, trained before any component is prepared.

Its sample does not depend on the weights: an equal share of ``tokenizer.train_bytes`` from each
component, the first documents that pass the component's own cleaning and filters (PII redacted, as
in a dataset) in its listing order. A change past that sample (a file appended to a component whose
share is already full) trains the same tokenizer again: its key is its content's hash, so every
component's prepare, keyed by that key, is served from the cache. ``tokenizer.file`` or a base model's
tokenizer, where given, is used instead and nothing is trained.
"""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Iterator

from common.contracts import TOKENIZER
from data_prep.config import DataConfig, TokenizerConfig
from data_prep.filters import filtered_text
from data_prep.parallel import trainer_threads, worker_count
from data_prep.readers import Skips, read_file
from data_prep.scan import max_doc_bytes
from data_prep.sources import list_files
from data_prep.tokenizer import train_tokenizer
from storage import Store

log = logging.getLogger(__name__)

TOKENIZERS = "tokenizers"


def component_sample(data: DataConfig, budget: int) -> Iterator[str]:
    """The first documents of a component that pass its filters, up to ``budget`` UTF-8 bytes."""
    taken = 0
    skips = Skips()
    for raw in list_files(data.sources, sniff=data.sniff_unlisted, follow_symlinks=data.follow_symlinks):
        for doc in read_file(raw, data.text_field, max_doc_bytes(data), skips):
            text, reason, _ = filtered_text(doc.text, data)
            if reason:
                continue
            yield text
            taken += len(text.encode("utf-8"))
            if taken >= budget:
                return


def mixture_tokenizer_digest(key: str) -> str:
    """The content hash a mixture tokenizer's key names (``tokenizers/<sha256[:16]>/tokenizer.json``), or ""."""
    parts = key.split("/")
    return parts[1] if len(parts) == 3 and parts[0] == TOKENIZERS and parts[2] == TOKENIZER else ""


def train_mixture_tokenizer(store: Store, components: list[DataConfig], config: TokenizerConfig) -> str:
    """Train the mixture's tokenizer on an equal share of each component; its store key
    (``tokenizers/<sha256>/tokenizer.json``, written once: the same bytes are the same key)."""
    share = max(1, config.train_bytes // len(components))

    def texts() -> Iterator[str]:
        for data in components:
            yield from component_sample(data, share)

    with trainer_threads(worker_count(components[0].workers)):
        tokenizer = train_tokenizer(texts(), config)
    data = tokenizer.to_str().encode()
    key = f"{TOKENIZERS}/{hashlib.sha256(data).hexdigest()[:16]}/{TOKENIZER}"
    if not store.exists(key):
        store.put_bytes(key, data)
    log.info("mixture tokenizer %s: %s components, %s bytes each at most", store.url(key), len(components), f"{share:,}")
    return key
