"""Which component of a blend each global sample position belongs to: a pure function of the weights.

The normalised weights are quantised to integer units ``u_c`` that sum to ``period`` (largest remainder;
a positive weight gets at least one). One period interleaves them by the stride (Sainte-Laguë, smooth round
robin) merge: the k-th sample of component c has key ``(2k + 1) / (2 u_c)``, and the samples are sorted by
key, ties by component index; the period repeats. A position's component and its place in that component's
own stream are then two table lookups, O(1), whatever the position.

What it guarantees (``tests/test_blend.py`` checks both):

- shares: in the first ``n`` positions, component c has ``count`` samples with
  ``|count − q_c·n| ≤ (1 + q_c·(C − 2)) / 2`` for ``C`` components of quantised weights ``q_c = u_c / period``
  (a prefix ends at some key t: each component has ``t·u_c ± ½`` samples, whose sum is the prefix's length).
  That is under 1 for two or three components, so ``|count − w_c·n| ≤ 1 + n/period`` for them; with four or
  more a share can lag by up to ``(C − 1)/2`` (0.97/0.01/0.01/0.01: 1.46 samples), never more;
- spread: every window of ``1/q_c + C − 1`` consecutive positions holds component c (between two of its keys,
  ``1/u_c`` apart, lie at most ``u_d/u_c + 1`` keys of each other component d).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from common.contracts import DatasetRef

DEFAULT_PERIOD = 2**20
"""Positions in one repetition of the order: weights are exact to 1/period, and the tables take 5 bytes each."""


def quantise(weights: np.ndarray, period: int) -> np.ndarray:
    """Integer units summing to ``period`` in the proportions of ``weights`` (normalised): largest remainder,
    and at least one unit for every positive weight, taken back from the largest units' smallest remainders."""
    exact = weights * period
    units = np.floor(exact).astype(np.int64)
    units[(weights > 0) & (units < 1)] = 1
    short = period - int(units.sum())
    remainder = exact - units
    index = np.arange(len(units))
    if short > 0:  # the remainders sum to `short`, each under 1: the largest `short` each take one more unit
        units[np.lexsort((index, -remainder))[:short]] += 1
    for _ in range(-short):  # weights below 1/period took a unit each: give them back, one at a time
        spare = np.flatnonzero(units > 1)
        units[spare[np.argmin(remainder[spare])]] -= 1
        remainder = exact - units
    return units


class BlendOrder:
    """The component of each global sample position and its position in that component's own order."""

    def __init__(self, weights: Sequence[float], period: int = DEFAULT_PERIOD) -> None:
        w = np.asarray(weights, dtype=np.float64)
        if w.ndim != 1 or not len(w) or not np.all(np.isfinite(w)) or np.any(w < 0) or w.sum() <= 0:
            raise ValueError(f"blend weights must be finite, non-negative and not all zero, got {list(weights)}")
        if len(w) > 127:
            raise ValueError(f"a blend of {len(w)} components: at most 127")  # the order's int8 table
        if period < np.count_nonzero(w):
            raise ValueError(f"period {period} is shorter than the {np.count_nonzero(w)} components that have weight")
        self.weights = w / w.sum()
        self.period = int(period)
        self.units = quantise(self.weights, self.period)
        """Each component's samples per period (int64, summing to ``period``)."""
        component = np.repeat(np.arange(len(w)), self.units)
        k = np.arange(self.period) - np.repeat(np.cumsum(self.units) - self.units, self.units)
        # Float64 division of exact integers is correctly rounded: equal rationals give equal keys, so a tie
        # is a tie and the component index breaks it, the same on every machine.
        key = (2 * k + 1) / (2 * self.units[component])
        at = np.lexsort((component, key))
        self.order = component[at].astype(np.int8)
        """The component at each offset of the period."""
        self.rank = k[at].astype(np.int32)
        """The samples of the same component before each offset in the period."""

    @property
    def components(self) -> int:
        return len(self.units)

    def locate(self, positions: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """The component of each global position and its component-local position (int64 arrays)."""
        positions = np.asarray(positions, dtype=np.int64)
        if positions.size and positions.min() < 0:
            raise ValueError("blend positions start at 0")
        cycle, offset = np.divmod(positions, self.period)
        component = self.order[offset].astype(np.int64)
        return component, cycle * self.units[component] + self.rank[offset]

    def counts(self, n: int) -> np.ndarray:
        """Samples of each component among positions ``[0, n)`` (int64), in O(components)."""
        if n < 0:
            raise ValueError(f"a count of positions is not negative, got {n}")
        cycles, m = divmod(int(n), self.period)
        return cycles * self.units + self._before(m)

    def _before(self, m: int) -> np.ndarray:
        """Samples of each component at offsets ``[0, m)`` of the period: those whose (key, component) sorts
        before offset m's, counted in integers (key ``(2j + 1) / (2 u_d)`` below ``(2r + 1) / (2 u_c)``)."""
        if m == 0:
            return np.zeros(self.components, dtype=np.int64)
        if m == self.period:
            return self.units.copy()
        c, r = int(self.order[m]), int(self.rank[m])
        out = np.zeros(self.components, dtype=np.int64)
        b = int(self.units[c])
        for d, u in enumerate(self.units.tolist()):
            a = (2 * r + 1) * u  # j counts where (2j + 1)·b < a: the odd numbers below a/b
            tied = a % b == 0 and (a // b) % 2 == 1  # (2j + 1)·b == a: before offset m only for a lower index
            out[d] = r if d == c else ((a - 1) // b + 1) // 2 + (tied and d < c)
        return out


def mixture_of(manifest: dict, ref: DatasetRef) -> list[dict]:
    """A dataset's components as its manifest lists them; a plain dataset is one component, ``data`` (its
    figures 0 where a manifest lacks them: registry tests register from a bare one)."""
    if "mixture" in manifest:
        return manifest["mixture"]
    stats, splits = manifest.get("stats", {}), manifest.get("splits", {})
    return [
        {
            "name": "data",
            "weight": 1.0,
            "max_epochs": 0.0,
            "dataset": ref.version,
            "prefix": ref.prefix,
            "train_sequences": int(splits.get("train", {}).get("sequences", 0)),
            "val_sequences": int(splits.get("val", {}).get("sequences", 0)),
            "stats": {k: int(stats.get(k, 0)) for k in ("train_tokens", "val_bytes", "val_doc_tokens", "documents_kept")},
        }
    ]


def overread_components(mixture: list[dict], samples: dict[str, int]) -> list[str]:
    """One line per component the run reads more times than its ``max_epochs`` (exact: ``samples`` are the
    run's samples of each component, its training split's sequences are in ``mixture``)."""
    out = []
    for part in mixture:
        epochs = samples.get(part["name"], 0) / max(1, part["train_sequences"])
        if part["max_epochs"] and epochs > part["max_epochs"]:
            out.append(
                f"data.mixture[{part['name']}]: the run reads it {epochs:.2f} times ({samples[part['name']]:,} samples of "
                f"{part['train_sequences']:,}), more than its max_epochs {part['max_epochs']:g}: lower its weight or the "
                "train budget, add data to it, or raise its max_epochs"
            )
    return out
