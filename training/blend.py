"""Training batches from a blend: a weighted mixture of committed datasets, each streamed by its own loader.

A blend's manifest lists its components (``mixture``: name, normalised weight, dataset version and prefix) and
its train split's shards, each naming its component and the component's prefix. ``data_prep.blend.BlendOrder``
gives each global position p its component c and component-local position q, a pure function of the weights;
component c's ``StreamingLoader`` (over c's shards, with c's dataset version: its own order, epochs and node
cache) serves q. So, as for one dataset: step s consumes ``[s·G, (s+1)·G)``, a data-parallel rank takes its
contiguous slice, the global batches do not depend on the data-parallel size, each byte is read once per node,
and the state is the samples consumed. Each component cycles through its own epochs at its own pace.

``open_loader`` is what the trainer calls: a blend's train split gets a ``BlendedLoader``; anything else (a blend's
validation split, a concatenation of its components' through the shards' prefixes, among them) a ``StreamingLoader``.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence

import numpy as np
import torch

from common.contracts import DatasetRef
from data_prep.blend import DEFAULT_PERIOD, BlendOrder
from data_prep.errors import DataError
from data_prep.manifest import load_manifest
from storage import Store, open_store
from training.data import Batch, LoaderStateError, StepBatches, StreamingLoader, split_shards

BLEND_FORMAT = "blend-v1"


class BlendedLoader(StepBatches):
    """This rank's share of each step's global batch of a blend: the ``StreamingLoader`` interface."""

    def __init__(
        self,
        components: Sequence[tuple[str, StreamingLoader]],
        weights: Sequence[float],
        global_batch_size: int,
        seed: int,
        version: str = "",
        period: int = DEFAULT_PERIOD,
    ) -> None:
        """``components``: (name, loader) in the mixture's order, each loader over that component's shards with its
        dataset version and the same ``reading``; ``version``: the blend's."""
        names = [name for name, _ in components]
        if len(set(names)) != len(names) or len(names) != len(weights):
            raise ValueError(f"a blend needs one weight per component and distinct names, got {names} and {list(weights)}")
        datasets = [loader.version for _, loader in components]
        if len(set(datasets)) != len(datasets):  # the same version twice would share one node cache folder and rank mark
            twice = sorted({f"{n} ({d})" for n, d in zip(names, datasets, strict=True) if datasets.count(d) > 1})
            raise DataError(
                f"blend {version}: components {', '.join(twice)} are the same dataset: list it once, with their weights summed"
            )
        self.names = names
        self.loaders = [loader for _, loader in components]
        self.blend = BlendOrder(weights, period)
        self.global_batch_size = global_batch_size
        self.seed = seed
        self.version = version
        self.reading = self.loaders[0].reading
        self.row_len = self.loaders[0].row_len

    @classmethod
    def of_manifest(
        cls, store: Store, ref: DatasetRef, manifest: dict, split: str, global_batch_size: int, seed: int, **kwargs
    ) -> BlendedLoader:
        """The loader of a blend's split (its manifest already loaded from ``store``); ``kwargs``: those of
        ``StreamingLoader``'s constructor, given to every component's loader."""
        mixture = manifest["mixture"]
        entries = manifest["splits"][split]["shards"]
        shards = split_shards(store, ref, manifest, split)
        kwargs = {"row_len": int(manifest["seq_len"]) + 1, "split": split, **kwargs}
        if unknown := {int(e["component"]) for e in entries} - set(range(len(mixture))):
            raise ValueError(
                f"blend {ref.version}: shards of split {split!r} name components {sorted(unknown)}, not in its mixture"
            )
        components = []
        for c, part in enumerate(mixture):
            mine = [shard for shard, entry in zip(shards, entries, strict=True) if int(entry["component"]) == c]
            if not mine:
                raise ValueError(f"blend {ref.version}: component {c} ({part['name']}) has no shards in split {split!r}")
            components.append((part["name"], StreamingLoader(mine, global_batch_size, seed, part["dataset"], **kwargs)))
        return cls(components, [float(part["weight"]) for part in mixture], global_batch_size, seed, ref.version)

    # -- order: positions and batch are StepBatches'; rows_at reads them -----------------
    def rows_at(self, positions: np.ndarray) -> Batch:
        """The rows at increasing global ``positions``: each component's from its loader (its local positions
        increase too), put back in position order."""
        component, local = self.blend.locate(positions)
        tokens: torch.Tensor | None = None
        waited = 0.0
        for c in np.unique(component).tolist():
            at = np.flatnonzero(component == c)
            part = self.loaders[c].rows_at(local[at])
            if tokens is None:
                tokens = torch.empty((len(positions), part.tokens.shape[1]), dtype=torch.int64)
            tokens[torch.from_numpy(at)] = part.tokens
            waited += part.wait_s
        if tokens is None:
            raise ValueError("no positions to read")
        return Batch(tokens=tokens, wait_s=waited)

    def origin(self, step: int) -> dict:
        """Where step ``step``'s global batch came from: each component's shards and the rows read from them
        (``StreamingLoader.origin``'s entries, each with its ``component``)."""
        component, local = self.blend.locate(self.positions(step))
        shards = []
        for c in np.unique(component).tolist():
            shards += [{"component": self.names[c], **s} for s in self.loaders[c].shards_at(local[component == c])]
        return {"step": step + 1, "shards": shards}

    def samples_per_component(self, step: int) -> dict[str, int]:
        """Samples of each component consumed by steps ``1..step`` (``step`` steps done), for the run log and lineage."""
        counts = self.blend.counts(step * self.global_batch_size).tolist()
        return dict(zip(self.names, counts, strict=True))

    # -- state ------------------------------------------------------------------------
    def state_dict(self, step: int) -> dict:
        """What a checkpoint records: enough to check that a resume continues the same sequence."""
        return {
            "format": BLEND_FORMAT,
            "dataset": self.version,
            "seed": self.seed,
            "window_shards": self.loaders[0].window_shards,
            "global_batch_size": self.global_batch_size,
            "consumed_samples": step * self.global_batch_size,
            "period": self.blend.period,
            # The weights as quantised: the order is a function of these integers, exactly comparable.
            "components": [
                {"name": name, "dataset": loader.version, "units": int(units)}
                for name, loader, units in zip(self.names, self.loaders, self.blend.units, strict=True)
            ],
            "component_samples": self.samples_per_component(step),
        }

    def check_resume(self, state: dict, step: int) -> None:
        """Raise unless ``state`` (from a checkpoint at ``step``) continues this blend's sequence: a single
        dataset's state, or another blend (other components or weights), is refused, naming what differs."""
        if state.get("format") != BLEND_FORMAT:
            raise LoaderStateError(
                f"the checkpoint's data order cannot be continued: it is {state.get('format')!r} "
                f"(dataset {state.get('dataset')}), not a blend's ({BLEND_FORMAT}, dataset {self.version})"
            )
        expected = self.state_dict(step)
        diff = [_components_diff(state.get("components") or [], expected["components"])]
        diff += [
            f"{k}: checkpoint {state.get(k)!r} vs now {v!r}"
            for k, v in expected.items()
            if k != "components" and state.get(k) != v
        ]
        if details := ", ".join(d for d in diff if d):
            raise LoaderStateError(f"the checkpoint's data order cannot be continued ({details})")

    # -- reading ----------------------------------------------------------------------
    @property
    def store_bytes(self) -> Counter[int]:
        """Bytes this rank fetched from the store, per epoch of each component, summed over the components."""
        return sum((loader.store_bytes for loader in self.loaders), Counter())

    @property
    def cache_bytes(self) -> Counter[int]:
        """Bytes of windows this rank read from the node's cache, per component epoch, summed over the components."""
        return sum((loader.cache_bytes for loader in self.loaders), Counter())

    def wait_idle(self) -> None:
        """Let in-flight reads finish (before something forks, e.g. a checkpoint's writer processes)."""
        for loader in self.loaders:
            loader.wait_idle()

    def close(self) -> None:
        for loader in self.loaders:
            loader.close()

    def __enter__(self) -> BlendedLoader:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def _components_diff(saved: list[dict], now: list[dict]) -> str:
    """The blend components that differ between a checkpoint and now, named ('' where none do)."""

    def describe(part: dict | None) -> str:
        return "none" if part is None else f"{part.get('name')} (dataset {part.get('dataset')}, {part.get('units')} units)"

    out = [
        f"component {i}: checkpoint {describe(a)} vs now {describe(b)}"
        for i in range(max(len(saved), len(now)))
        if (a := saved[i] if i < len(saved) else None) != (b := now[i] if i < len(now) else None)
    ]
    return ", ".join(out)


def open_loader(
    ref: DatasetRef, split: str, global_batch_size: int, seed: int, **kwargs
) -> tuple[StreamingLoader | BlendedLoader, dict]:
    """The loader of a dataset's split and its manifest (``kwargs``: ``StreamingLoader.for_split``'s): a
    ``BlendedLoader`` for a blend's train split, else a ``StreamingLoader`` (a blend's validation split is the
    plain concatenation of its shards, read from their components' prefixes)."""
    store = open_store(ref.store)
    manifest = load_manifest(store, ref)
    kind = BlendedLoader if split == "train" and "mixture" in manifest else StreamingLoader
    return kind.of_manifest(store, ref, manifest, split, global_batch_size, seed, **kwargs), manifest
