"""What flows between the stages, and where it lives in the store. Torch-free, Flyte-free.

    prepare ─▶ DatasetRef ─▶ validate ─▶ DatasetRef ─▶ train ─▶ CheckpointRef ─▶ evaluate ─▶ EvalReport ─▶ register ─▶ ModelRef

Flyte passes these records between tasks and caches on them; each points into the store,
whose layout is spelled out once, by the key functions below:

    datasets/<version>/                    manifest.json, tokenizer.json, doc_stats.csv, shards/, _COMMITTED
    datasets/<version>/validation/         result.json, suite.json, report.html, _COMMITTED
    runs/<run>/checkpoints/step-NNNNNNN/   model/, rng/, meta.json, metrics.jsonl, _COMMITTED
    runs/<run>/metrics.jsonl, tensorboard/, lease.json, lease-sequence.json, goodput/
    runs/<run>/eval/<key>/                 results.json, hf/, _COMMITTED
    models/<name>/<version>/               card.json, card.md, checkpoint/, tokenizer.json, evaluation.json, hf/, _COMMITTED
    models/<name>/aliases/<alias>.json
    models/<name>/registrations/<identity>.json

A prefix counts only once its ``_COMMITTED`` marker exists (``storage``).

The run id leaves the parallel layout out (a retry may reshard), so one run can be trained
by several layouts: each checkpoint's ``meta.json`` carries the history of which layout
trained which steps (``LayoutSpan``), the ``CheckpointRef`` carries it on, and the model card
(``ModelCard``, the end of the line) records it.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, fields
from typing import Any

from common.errors import UserError

# -- the tokenizer's special tokens: every packed document ends with EOD (data_prep.shards.pack),
# which training's loss mask, the evaluation and the Hugging Face export read back by name ----------
EOD_TOKEN = "<|endoftext|>"
PAD_TOKEN = "<|pad|>"
SPECIAL_TOKENS = [EOD_TOKEN, PAD_TOKEN]

# -- file names inside a prefix ---------------------------------------------------------
MANIFEST = "manifest.json"
TOKENIZER = "tokenizer.json"
DOC_STATS = "doc_stats.csv"
VALIDATION_RESULT = "result.json"
VALIDATION_SUITES = "suite.json"
VALIDATION_REPORT = "report.html"
CHECKPOINT_MODEL = "model"
CHECKPOINT_META = "meta.json"
CHECKPOINT_DIGESTS = "digests.json"
"""Every file of a checkpoint folder and its sha256, written at commit, checked before a load."""
METRICS = "metrics.jsonl"
TENSORBOARD = "tensorboard"
STEP_TIMES = "step_times.jsonl"
HEALTH = "health.jsonl"
DIAGNOSTICS = "diagnostics"
GOODPUT = "goodput"
"""The folder of a run's goodput ledger: one file per training attempt (``runs.ledger``)."""
EVAL_RESULTS = "results.json"
HF_EXPORT = "hf"
CARD = "card.json"
CARD_MARKDOWN = "card.md"
ENTRY_CHECKPOINT = "checkpoint"
"""A registry entry's copy of the checkpoint: ``model/``, ``meta.json`` and their ``digests.json``."""
ENTRY_EVALUATION = "evaluation.json"
"""A registry entry's copy of the evaluation's ``results.json``."""
RUN_LEASE = "lease.json"
"""Who trains a run now (host, pid, token, heartbeat): identical executions share the run's prefix."""
RUN_LEASE_SEQUENCE = "lease-sequence.json"
"""The count of the run's leases taken so far (``runs.lease``): it orders the run's attempts (``runs.ledger``)."""


# -- store keys ---------------------------------------------------------------------------
DATASETS, RUNS, MODELS = "datasets", "runs", "models"
STORE_TOPS = (DATASETS, RUNS, MODELS)
"""The store's top folders: each holds entries (a dataset, a run, a model), never deleted whole."""


def dataset_prefix(version: str) -> str:
    return f"{DATASETS}/{version}"


def validation_prefix(dataset: str) -> str:
    """The validation outputs of the dataset at key prefix ``dataset``."""
    return f"{dataset}/validation"


def run_prefix(run_id: str) -> str:
    return f"{RUNS}/{run_id}"


def checkpoints_prefix(run: str) -> str:
    """The folder of a run's checkpoints; ``run`` is the run's key prefix."""
    return f"{run}/checkpoints"


def checkpoint_prefix(run: str, step: int) -> str:
    return f"{checkpoints_prefix(run)}/step-{step:07d}"


def step_of_checkpoint(name: str) -> int | None:
    """The step of a checkpoint folder's name (``step-0000300`` → 300), or None for another name."""
    digits = name.removeprefix("step-")
    return int(digits) if name.startswith("step-") and digits.isdigit() else None


def committed_steps(store, run: str) -> list[int]:
    """The steps of the run's committed checkpoints, oldest first (``run`` is ``runs/<id>``; ``store``
    is a ``storage.Store``, not imported here: common is a leaf)."""
    steps = (step_of_checkpoint(name) for name in store.children(checkpoints_prefix(run)))
    return sorted(s for s in steps if s is not None and store.is_committed(checkpoint_prefix(run, s)))


def prunable(steps: list[int], keep: int, keep_every: int = 0) -> list[int]:
    """Of a run's committed steps (oldest first), those its retention deletes: all but the ``keep`` latest
    (``keep`` 0: none deleted), less the multiples of ``keep_every`` (a WSD run's cooldown points; 0: none spared).
    Training prunes after each save, ``pretrain gc`` plans with the same rule."""
    older = steps[:-keep] if keep > 0 else []
    return [step for step in older if not (keep_every > 0 and step % keep_every == 0)]


def metrics_key(run: str) -> str:
    return f"{run}/{METRICS}"


def tensorboard_prefix(run: str) -> str:
    return f"{run}/{TENSORBOARD}"


def step_times_key(run: str) -> str:
    """Every rank's step-time breakdown, one line per (step, rank)."""
    return f"{run}/{STEP_TIMES}"


def health_key(run: str) -> str:
    """Loss-health events (NaN/Inf, spikes, skipped batches), one line each."""
    return f"{run}/{HEALTH}"


TRACE_SUFFIX = ".pt.trace.json.gz"
"""A rank's profiler trace: ``rank_NNNNN`` + this, the name TensorBoard's profiler plugin reads."""
MEMORY_SNAPSHOT_SUFFIX = ".memory_snapshot.pickle"
"""A rank's CUDA memory snapshot (pytorch.org/memory_viz)."""


def profile_prefix(run: str, first: int, last: int) -> str:
    """A profiled window's traces, where TensorBoard's profiler plugin looks for them."""
    return f"{tensorboard_prefix(run)}/plugins/profile/steps_{first:07d}-{last:07d}"


def diagnostics_prefix(run: str) -> str:
    """Stacks and collective flight-recorder dumps written when ranks stall."""
    return f"{run}/{DIAGNOSTICS}"


def lease_key(run: str) -> str:
    """The run's lease (``runs.lease``): one writer of the run's prefix at a time."""
    return f"{run}/{RUN_LEASE}"


def lease_sequence_key(run: str) -> str:
    """The run's lease sequence, ``{"last": n}``: the lease hands the next attempt n + 1 (rank 0, holding it)."""
    return f"{run}/{RUN_LEASE_SEQUENCE}"


def eval_prefix(run: str, key: str) -> str:
    return f"{run}/eval/{key}"


def model_root(name: str) -> str:
    return f"{MODELS}/{name}"


def model_prefix(name: str, version: int) -> str:
    return f"{model_root(name)}/{version}"


def card_key(entry: str) -> str:
    """The card of the registry entry at key prefix ``entry`` (``models/<name>/<version>``)."""
    return f"{entry}/{CARD}"


def registration_key(name: str, identity: str) -> str:
    """Which version a registration (``registry.register``, identified by a hash of what it
    registers) claimed: a replayed or concurrent identical registration finds it here."""
    return f"{model_root(name)}/registrations/{identity}.json"


def aliases_prefix(name: str) -> str:
    return f"{model_root(name)}/aliases/"


def alias_key(name: str, alias: str) -> str:
    return f"{aliases_prefix(name)}{alias}.json"


# -- records passed between tasks ---------------------------------------------------------
@dataclass
class DatasetRef:
    """A committed dataset in the store: what later stages need to find and trust it."""

    store: str
    """Store URI the dataset lives in."""
    version: str
    """Content hash of the manifest."""
    prefix: str
    """Key prefix of the dataset inside the store (``datasets/<version>``)."""
    stats: dict[str, int] = field(default_factory=dict)
    """Document, token and skip counts."""


@dataclass
class Layout:
    """How the ranks of one training session split the model and its optimizer."""

    world_size: int = 1
    """Ranks in the session."""
    tensor_parallel: int = 1
    """Tensor-parallel size."""
    pipeline_parallel: int = 1
    """Pipeline stages."""
    distributed_optimizer: bool = False
    """Whether the optimizer state was sharded across data-parallel ranks."""
    fsdp: bool = False
    """Whether weights, gradients and optimizer state were all sharded across data-parallel ranks (FSDP).
    Layouts recorded before the field existed read as False, which they were."""

    @property
    def data_parallel(self) -> int:
        return self.world_size // (self.tensor_parallel * self.pipeline_parallel)

    def describe(self) -> str:
        return (
            f"tensor_parallel={self.tensor_parallel}, pipeline_parallel={self.pipeline_parallel}, "
            f"data_parallel={self.data_parallel}, distributed_optimizer={str(self.distributed_optimizer).lower()}, "
            f"fsdp={str(self.fsdp).lower()}"
        )


@dataclass
class LayoutSpan:
    """Steps ``first_step`` to ``last_step`` (1-based, both included) were trained by ``layout``."""

    first_step: int
    last_step: int
    layout: Layout

    def describe(self) -> str:
        return f"steps {self.first_step}-{self.last_step}: {self.layout.describe()}"

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> LayoutSpan:
        return cls(first_step=d["first_step"], last_step=d["last_step"], layout=Layout(**d["layout"]))


def extend_layouts(history: list[LayoutSpan], first_step: int, last_step: int, layout: Layout) -> list[LayoutSpan]:
    """``history`` followed by steps ``first_step``..``last_step`` trained by ``layout``; the
    last span grows instead when it ends right before, with the same layout (a plain resume)."""
    if last_step < first_step:
        return list(history)
    if history and history[-1].layout == layout and history[-1].last_step == first_step - 1:
        return [*history[:-1], LayoutSpan(history[-1].first_step, last_step, layout)]
    return [*history, LayoutSpan(first_step, last_step, layout)]


def describe_layouts(history: list[LayoutSpan]) -> str:
    """One line: ``steps 1-30: tensor_parallel=1, …; steps 31-40: …``."""
    return "; ".join(span.describe() for span in history) or "not recorded"


@dataclass
class CheckpointRef:
    """A committed checkpoint in the store and what produced it."""

    store: str
    """Store URI."""
    run: str
    """Key prefix of the training run (``runs/<id>``)."""
    prefix: str
    """Key prefix of the committed checkpoint."""
    step: int
    """Optimizer steps done."""
    dataset: DatasetRef
    """The dataset it was trained on."""
    base_model: str = ""
    """Registry entry whose weights started the run ('' = trained from scratch)."""
    summary: dict[str, float] = field(default_factory=dict)
    """Final loss, throughput and size figures (of the session that trained the last steps)."""
    layouts: list[LayoutSpan] = field(default_factory=list)
    """Which parallel layout trained which steps, oldest first (from the checkpoints' meta.json).
    The run id leaves the layout out, so this may differ from the layout the caller asked for."""
    cooled_from: str = ""
    """Key prefix of the checkpoint a WSD cooldown started from ('' = not a cooldown)."""


@dataclass
class EvalReport:
    """Held-out results of one checkpoint."""

    checkpoint: CheckpointRef
    """The checkpoint evaluated."""
    val_loss: float
    """Mean next-token cross-entropy on the validation split (nats)."""
    perplexity: float
    """exp(val_loss)."""
    tokens_evaluated: int
    """Validation tokens scored."""
    bits_per_byte: float
    """Validation loss in bits per UTF-8 byte of text: comparable across tokenizers."""
    sample: str
    """Greedy continuation of the configured prompt."""
    sampled: str = ""
    """Seeded, temperature-sampled continuation of the prompt."""
    baseline: str = ""
    """Registry entry the candidate was compared with ('' = none registered under the gate alias)."""
    baseline_bits_per_byte: float = -1.0
    """The baseline's bits per byte on the same validation rows (-1: none, or not comparable)."""
    outputs: str = ""
    """Key prefix of the committed evaluation files: ``results.json`` and the Hugging Face export ``hf/``."""
    lm_eval: dict[str, float] = field(default_factory=dict)
    """lm-evaluation-harness figures on the held-out tasks, ``lm_eval.<task>.<metric>`` (stderr and
    example counts are in ``results.json``)."""
    baseline_lm_eval: dict[str, float] = field(default_factory=dict)
    """The baseline's lm-eval figures on the very same examples ({}: no baseline, or no export to run)."""
    lm_eval_examples: dict[str, str] = field(default_factory=dict)
    """sha256 of each lm-eval task's examples (its JSONL): equal digests, the same examples."""
    export_digests: dict[str, str] = field(default_factory=dict)
    """sha256 of each file of the Hugging Face export (``hf/``), by path inside it, taken as it was written:
    registration copies only these bytes, and a baseline's export is checked against them before lm-eval
    reads it (the store's run folder can be written by the train role)."""
    base: dict[str, float] = field(default_factory=dict)
    """The base model's figures on the very same validation rows (``val_loss``, ``perplexity``,
    ``bits_per_byte``) when the checkpoint continued one ({}: trained from scratch): what continuing changed."""
    components: dict[str, dict[str, float]] = field(default_factory=dict)
    """A mixture's figures per component (``val_loss``, ``bits_per_byte``), each on its own validation rows
    ({}: one dataset). The overall figures above are over all of them; the gate compares those."""


@dataclass
class TrackingRef:
    """The MLflow run that mirrors one pipeline execution (``tracking``)."""

    uri: str = ""
    """MLflow tracking URI the run lives at ('' = tracking off)."""
    experiment: str = ""
    """MLflow experiment name."""
    execution: str = ""
    """The pipeline execution this run mirrors (Flyte's execution id; a fresh id for a local run)."""
    run_id: str = ""
    """MLflow run id ('' = not created yet: the server was unreachable; the last task creates it)."""
    run_name: str = ""
    """The execution's name for people (``common.run_names``): the MLflow run's, and the training run's record."""


@dataclass
class ModelRef:
    """A committed registry entry."""

    store: str
    """Store URI."""
    name: str
    """Model name."""
    version: int
    """Version number within the name."""
    prefix: str
    """Key prefix of the entry (``models/<name>/<version>``)."""


# -- the model card: models/<name>/<version>/card.json ------------------------------------
CARD_FORMAT = 2
"""Format 2 added ``layouts`` and ``format``. Format 1 cards (no ``format`` key) still load,
with an empty layout history: they recorded only the layout the config asked for."""


class CardFormatError(UserError, ValueError):
    """A card.json this release cannot read."""


@dataclass
class CodeRevision:
    """The project's git commit at registration."""

    commit: str = "unknown"
    dirty: bool | None = None
    """Whether the tree had uncommitted changes (None: not a git checkout)."""


@dataclass
class ImportedFrom:
    """The Hugging Face checkpoint an imported model's weights and tokenizer came from."""

    architecture: str
    """``config.json``'s architecture, e.g. ``Qwen2ForCausalLM``."""
    family: str
    """``hf_interop.families``: llama, mistral, qwen2 or qwen3."""
    files: dict[str, str]
    """sha256 of every file the import read, by name."""
    name_or_path: str = ""
    """``config.json``'s ``_name_or_path`` (the hub id it was saved from), when it has one."""
    revision: str = ""
    """The hub revision, when the folder says (a ``huggingface_hub`` snapshot is named by it)."""
    folder: str = ""
    """The folder as given to ``pretrain registry import``."""


@dataclass
class MixtureShare:
    """One component of the data a model trained on: its dataset, its share and what the run took of it."""

    name: str
    dataset_version: str
    weight: float
    """Its share of the training samples (the weights normalised)."""
    tokens_trained: int
    """Tokens of it the run trained on."""
    epochs: float
    """Passes over its training split (tokens trained ÷ its training tokens)."""


@dataclass
class Lineage:
    """Where the model came from: every input, as a key of the registry's store or a content hash. Places
    are keys, so that a copied or moved store still reads (``registry.card.location_url`` makes their URLs);
    cards of before hold absolute URLs, which ``registry.card.read_card`` reads back as keys."""

    dataset_version: str
    dataset: str
    """Key of the dataset prefix (its URL when the dataset is in another store)."""
    dataset_manifest: str
    """Key of the dataset's manifest.json."""
    tokenizer_sha256: str
    training_run: str
    """Key prefix of the training run (``runs/<id>``)."""
    training_steps: int
    checkpoint: str
    """Key of the committed checkpoint the entry copied."""
    base_model: str = ""
    """Registry entry whose weights started training ('' = from scratch)."""
    cooldown_from: str = ""
    """Key of the checkpoint (of another run) a WSD cooldown continued ('' = not a cooldown)."""
    evaluation: str = ""
    """Key of the committed evaluation outputs ('' = registered without them)."""
    flyte_execution_id: str = ""
    eod_token: str = ""
    """The token that ends a document in the model's tokenizer ('' = ``<|endoftext|>``, this pipeline's)."""
    imported_from: ImportedFrom | None = None
    """The Hugging Face checkpoint of an imported model (None: trained here)."""
    mixture: list[MixtureShare] = field(default_factory=list)
    """What the model trained on, one entry per component of the mixture (one for a plain dataset; none
    on cards of before and on imported models)."""


@dataclass
class GateDecision:
    """The quality gate's verdict on the candidate, and why."""

    alias: str
    """The alias the gate guards (e.g. ``production``)."""
    baseline: str
    """Registry entry holding the alias before ('' = none)."""
    baseline_bits_per_byte: float | None
    """The baseline's bits per byte on the same rows (None: none, or not comparable)."""
    candidate_bits_per_byte: float
    tolerance: float
    promoted: bool
    reason: str
    metric: str = "bits_per_byte"
    """The figure that decided: ``bits_per_byte`` (lower is better) or ``lm_eval.<task>.<metric>``
    (acc and acc_norm: higher is better). Cards from before this field were decided by bits per byte."""
    candidate_value: float | None = None
    """The candidate's ``metric`` (None: not measured)."""
    baseline_value: float | None = None
    """The baseline's ``metric`` on the same rows or examples (None: none, or not comparable)."""


@dataclass
class ModelCard:
    """Everything the registry records about one version; ``card.json`` is ``to_dict()``."""

    name: str
    version: int
    registered_at: str
    """ISO 8601, UTC."""
    metrics: dict[str, float]
    """Evaluation (val_loss, perplexity, bits_per_byte, val_tokens) and training summary figures."""
    sample: str
    """Greedy continuation of the evaluation prompt."""
    sampled: str
    """Seeded, sampled continuation."""
    lineage: Lineage
    layouts: list[LayoutSpan]
    """The layouts that actually trained each range of steps: the truth, unlike ``config['parallel']``."""
    config: dict[str, Any]
    """The pipeline config as asked (``PipelineConfig`` as a dict)."""
    code: CodeRevision
    gate: GateDecision | None = None
    """None when registered outside the workflow's gate."""
    hf_export: str = ""
    """Folder of the Hugging Face export inside the entry ('' = none)."""
    run_name: str = ""
    """The run's name for people (``common.run_names``: model, data, the settings that differ); '' on cards of before
    and on imported models."""
    format: int = CARD_FORMAT

    def model_config(self, defaults: dict[str, Any] | None = None) -> dict[str, Any]:
        """The ``model`` section of the config it was trained with; ``defaults``: the model section's defaults,
        which fill the keys of a card written before they existed."""
        return {**(defaults or {}), **self.config.get("model", {})}

    def shape_differences(self, model: dict[str, Any], defaults: dict[str, Any] | None = None) -> list[str]:
        """The keys of the model section ``model`` whose value is not this model's (``kernels``, how it is
        computed, aside), with ``defaults`` as ``model_config``'s."""
        trained = self.model_config(defaults)
        return [k for k in sorted(model) if k != "kernels" and trained.get(k) != model.get(k)]

    def continuation_problem(self, model: dict[str, Any], defaults: dict[str, Any] | None = None) -> str:
        """Why a run with ``model`` (a model section) cannot continue this model, or '' if it can:
        continued pretraining keeps the shape (``shape_differences``)."""
        trained = self.model_config(defaults)
        differ = self.shape_differences(model, defaults)
        if not differ:
            return ""
        details = ", ".join(f"model.{k}: {trained.get(k)!r} there, {model.get(k)!r} here" for k in differ)
        return (
            f"train.init_from names {self.name}:{self.version}, whose model section differs ({details}): "
            "continue it with the same model section, or train from scratch (train.init_from: '')"
        )

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> ModelCard:
        """The card of ``card.json``; raises CardFormatError naming what does not fit."""
        version = d.get("format", 1)
        if version not in (1, CARD_FORMAT):
            raise CardFormatError(f"card format {version} is not one this release reads (1 or {CARD_FORMAT})")
        try:
            _known_keys(cls, d)
            _known_keys(Lineage, d["lineage"])
            return cls(
                name=d["name"],
                version=d["version"],
                registered_at=d["registered_at"],
                metrics=dict(d["metrics"]),
                sample=d["sample"],
                sampled=d.get("sampled", ""),
                lineage=_lineage(d["lineage"]),
                layouts=[LayoutSpan.from_dict(span) for span in d.get("layouts", [])],
                config=dict(d["config"]),
                code=CodeRevision(**d["code"]),
                gate=GateDecision(**d["gate"]) if d.get("gate") else None,
                hf_export=d.get("hf_export", ""),
                run_name=d.get("run_name", ""),
                format=version,
            )
        except KeyError as e:
            raise CardFormatError(f"card has no {e.args[0]!r}") from e
        except (TypeError, AttributeError) as e:
            raise CardFormatError(f"card does not fit format {version}: {e}") from e


def _lineage(d: dict[str, Any]) -> Lineage:
    imported = d.get("imported_from")
    if imported is not None:
        _known_keys(ImportedFrom, imported)
    mixture = d.get("mixture") or []
    for share in mixture:
        _known_keys(MixtureShare, share)
    return Lineage(
        **{**d, "imported_from": ImportedFrom(**imported) if imported else None, "mixture": [MixtureShare(**m) for m in mixture]}
    )


def _known_keys(cls: type, d: dict[str, Any]) -> None:
    unknown = set(d) - {f.name for f in fields(cls)}
    if unknown:
        raise CardFormatError(f"card has unknown {cls.__name__} keys {sorted(unknown)}")
