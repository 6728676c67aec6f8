"""A data mixture (``data.mixture``): its components, each a data section of its own, and the
warning that a weight asks for more passes over a component than its ``max_epochs``.

A component's ``DataConfig`` is the section with the component's sources and the keys it sets
(``DataConfig.component_data``) and no mixture: weights shape no dataset, so they are part of no
dataset's version or cache key. Without a mixture the one component is the section itself,
unchanged (a single-source run keeps its dataset version). The class and its checks live in
``data_prep.config`` (``MixtureComponent``, ``DataConfig.mixture_problems``), beside the section.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from common.settings import problems_error
from data_prep.config import DataConfig, MixtureComponent
from data_prep.errors import DataError
from data_prep.sources import list_files

__all__ = ["Component", "MixtureComponent", "components", "epoch_warnings", "estimated_tokens"]

SINGLE = "data"
"""The name of the one component of a run without a mixture."""


@dataclass(frozen=True)
class Component:
    """One component as the pipeline reads it: its share of the training tokens and its data section."""

    name: str
    weight: float
    """Its share of the training tokens (the components' weights sum to 1)."""
    max_epochs: float
    """Most passes over its data the run should make (a single source: unbounded, as without a mixture)."""
    data: DataConfig
    """The data section it is prepared with: its sources and keys, no mixture."""


def components(data: DataConfig) -> list[Component]:
    """The components of ``data``: without a mixture one, ``data`` itself (the same object), named
    ``data``; with one, each with its weight normalised to a share. A mixture with problems
    (``DataConfig.mixture_problems``) raises ConfigError listing them."""
    if not data.mixture:
        return [Component(SINGLE, 1.0, math.inf, data)]
    problems = data.mixture_problems()
    if problems:
        raise problems_error(problems)
    total = sum(comp.weight for comp in data.mixture)
    return [Component(c.name, c.weight / total, c.max_epochs, data.component_data(c)) for c in data.mixture]


def estimated_tokens(data: DataConfig, bytes_per_token: float = 4.0) -> float | None:
    """Tokens in the local and ``python-stdlib`` sources of ``data``, estimated from their files' bytes
    (listed as the prepare step lists them; compressed files count their compressed size). ``s3://``
    sources are not listed (a check stays local and cheap); None when nothing local can be listed."""
    local = [s for s in data.sources if isinstance(s, str) and s and not s.startswith("s3://")]
    if not local:
        return None
    try:
        files = list_files(local, sniff=data.sniff_unlisted, follow_symlinks=data.follow_symlinks)
    except (DataError, OSError):  # names nothing: path_problems says so
        return None
    return sum(f.size for f in files if not f.problem) / bytes_per_token


def epoch_warnings(data: DataConfig, train_tokens: int, bytes_per_token: float = 4.0) -> list[str]:
    """One line for each mixture component the run would read more times than its ``max_epochs``:
    its share of ``train_tokens`` against its tokens estimated from its files' bytes (``bytes_per_token``
    bytes a token). None without a mixture."""
    if not data.mixture:
        return []
    out = []
    for comp in components(data):
        held = estimated_tokens(comp.data, bytes_per_token)
        if not held:
            continue
        wanted = comp.weight * train_tokens
        epochs = wanted / held
        if epochs > comp.max_epochs:
            out.append(
                f"data.mixture[{comp.name}]: the run would read it about {epochs:.1f} times (weight {comp.weight:.3g} of "
                f"{train_tokens:,} tokens ≈ {wanted:,.0f} tokens, the component holds ≈ {held:,.0f} tokens estimated "
                f"from its files' bytes), more than its max_epochs {comp.max_epochs:g}: lower its weight or the "
                "train budget, add data to it, or raise its max_epochs"
            )
    return out
