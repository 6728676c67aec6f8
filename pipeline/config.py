"""The pipeline's one input: a tree of the libraries' config sections, and YAML presets.

Every section lists its own problems (``problems()``); ``PipelineConfig`` adds the rules that
span sections. They run wherever a config is built: ``PipelineConfig(...)`` itself refuses a
config that cannot work (``__post_init__``), and the places a run is launched from, a preset
read by ``load_config`` (``pretrain run``, ``pretrain check``) and ``pyflyte run … --config``
(flytekit builds the input through ``PipelineConfig.from_json``), also check what the launching
machine decides: that local corpus paths exist, that the layout fits the train task's world
(``$PRETRAIN_CLUSTER``'s nodes × ranks per node) and, under a profile whose tasks run on a cluster,
that the runs are tracked by an MLflow server (``tracking_problems``). Nothing runs and nothing is
written before.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from common.docfields import documented
from common.errors import ConfigError
from common.names import spec_problem
from common.settings import from_dict, listed, problems_error, read_settings, setting_type, whole_number
from data_prep.config import DataConfig, TokenizerConfig, ValidationConfig
from evaluation.config import EvalConfig
from evaluation.lm_eval_catalog import parse_metric_name, shipped_tasks
from pipeline.cluster import CLUSTER_ENV, ClusterConfig, load_cluster
from registry.config import DEFAULT_GATE_METRIC, RegistryConfig
from tracking.config import TrackingConfig
from tracking.uri import TRACKING_URI_ENV, is_remote
from training.config import (
    FP8_NEEDS,
    ModelConfig,
    ParallelConfig,
    Precision,
    TrainConfig,
    batch_problems,
    layout_problems,
    world_problems,
)

__all__ = [
    "PipelineConfig",
    "RegistryConfig",
    "from_dict",
    "launch_world",
    "load_config",
    "parse_config",
    "tracking_problems",
]


# Set while a loader builds a config it checks whole afterwards, with the launch rules.
_deferred: ContextVar[bool] = ContextVar("pipeline_config_deferred", default=False)


@documented
@dataclass
class PipelineConfig:
    """Everything a pretraining run needs. Every section has working defaults."""

    store: str = ""
    """Object store for datasets, checkpoints and the registry: a local path or s3://bucket/prefix
    (empty = $PRETRAIN_STORE, else ~/.local/share/pretrain/store)."""
    data: DataConfig = field(default_factory=DataConfig)
    """Corpus, cleaning, packing and sharding."""
    tokenizer: TokenizerConfig = field(default_factory=TokenizerConfig)
    """The BPE tokenizer trained on the corpus."""
    validation: ValidationConfig = field(default_factory=ValidationConfig)
    """Thresholds of the data validation gate."""
    model: ModelConfig = field(default_factory=ModelConfig)
    """The GPT's shape."""
    parallel: ParallelConfig = field(default_factory=ParallelConfig)
    """Tensor/pipeline split of the ranks."""
    train: TrainConfig = field(default_factory=TrainConfig)
    """Optimisation and checkpointing."""
    evaluation: EvalConfig = field(default_factory=EvalConfig)
    """Held-out evaluation."""
    registry: RegistryConfig = field(default_factory=RegistryConfig)
    """Model registration."""
    tracking: TrackingConfig = field(default_factory=TrackingConfig)
    """Experiment tracking in MLflow."""
    cluster_profile: str = ""
    """The cluster profile this config is written for (a name under configs/cluster/, e.g. gpu-2x8);
    launched under another one ($PRETRAIN_CLUSTER) it warns. '' = any profile."""

    def __post_init__(self) -> None:
        # A config built in Python (by hand, or by flytekit from a task's input) must be able to run; the
        # loaders defer this and check once, launch rules included.
        if not _deferred.get():
            self.check()

    def problems(
        self, world_size: int | None = None, where: str = "", cluster: ClusterConfig | None = None, profile: str = ""
    ) -> list[str]:
        """Every problem, one line each: each section's own, then the rules that span sections.
        With ``world_size`` (ranks of the train task; ``where`` says where that number comes
        from), also what the launching machine decides: local corpus paths that name nothing,
        and a layout or batch that does not split over that world. With ``cluster`` (the cluster
        profile, named ``profile``), also where its pods track the run (``tracking_problems``)."""
        out: list[str] = []
        if "://" in self.store and not self.store.startswith(("s3://", "file://")):
            out.append(f"store is {self.store!r}: use a local path or s3://bucket/prefix ('' = $PRETRAIN_STORE)")
        elif self.store.startswith("s3://") and not self.store.removeprefix("s3://").strip("/"):
            out.append(f"store is {self.store!r}: name a bucket, s3://bucket/prefix")
        for section in (self.data, self.tokenizer, self.validation, self.model, self.parallel, self.train, self.evaluation):
            out += section.problems()
        out += self.registry.problems()
        gate_task = parse_metric_name(self.registry.gate_metric)
        if gate_task and gate_task[0] in shipped_tasks() and gate_task[0] not in self.evaluation.lm_eval_tasks:
            out.append(
                f"registry.gate_metric is {self.registry.gate_metric!r} but evaluation.lm_eval_tasks "
                f"{self.evaluation.lm_eval_tasks} does not run {gate_task[0]}: add it there, or gate on {DEFAULT_GATE_METRIC}"
            )
        out += self.tracking.problems()
        out += layout_problems(self.model, self.parallel)
        tp, pp = self.parallel.tensor_parallel, self.parallel.pipeline_parallel
        if self.parallel.sequence_parallel and tp >= 2 and self.data.seq_len >= 1 and self.data.seq_len % tp:
            out.append(
                f"data.seq_len={self.data.seq_len} is not divisible by parallel.tensor_parallel={tp}: "
                "sequence parallelism splits each sequence over the tensor-parallel ranks"
            )
        if self.train.init_from and spec_problem(self.train.init_from):
            out.append(
                f"train.init_from is {self.train.init_from!r}: use NAME, NAME:VERSION or NAME:ALIAS of a "
                "registered model (e.g. gpt-tiny:latest), or '' to train from scratch"
            )
        if world_size is not None:
            out += self.data.path_problems() + self.tokenizer.path_problems()
            if tp >= 1 and pp >= 1:
                world = world_problems(self.parallel, world_size, where)
                out += world
                micro_ok = self.train.micro_batch_size >= 1 and self.train.global_batch_size % self.train.micro_batch_size == 0
                if not world and micro_ok:
                    dp = world_size // (tp * pp)
                    how = f" (data-parallel size = {world_size} ranks ÷ (TP {tp} × PP {pp}){where})"
                    out += batch_problems(self.train, dp, how)
        if cluster is not None:
            out += tracking_problems(self.tracking, cluster, profile)
            out += precision_problems(self.train, cluster, profile)
        return out

    def check(
        self,
        world_size: int | None = None,
        where: str = "",
        source: str = "",
        cluster: ClusterConfig | None = None,
        profile: str = "",
    ) -> None:
        """Raise one ConfigError listing every problem (see ``problems``); ``source`` names the file."""
        problems = self.problems(world_size, where, cluster, profile)
        if problems:
            raise problems_error(problems, source)

    @classmethod
    def from_json(cls, text: str) -> PipelineConfig:
        """What ``pyflyte run … --config FILE`` builds the input with: flytekit reads the YAML or
        JSON file and calls ``from_json`` when the dataclass has one. The same strict reading as a
        preset (unknown keys are errors, not dropped) and the same checks, launch rules included."""
        try:
            return parse_config(json.loads(text))
        except ConfigError as e:
            import click  # flytekit's command line is click's: its own error, printed without a traceback

            raise click.BadParameter(str(e)) from e


def tracking_problems(tracking: TrackingConfig, cluster: ClusterConfig, profile: str = "") -> list[str]:
    """Under a profile whose tasks run on a cluster (``cluster.remote``), one line if the run would not be
    tracked by an MLflow server: the URI its pods record into, ``tracking.uri`` or else the profile's
    ``tracking_uri`` (their $MLFLOW_TRACKING_URI), is a SQLite database, a file: URI, a plain path or
    none at all (a SQLite file in the pod), or a database MLflow would keep the artifacts beside (in the
    pod). Such a run is lost with its pod. A local profile keeps its SQLite default; tracking off passes."""
    if not cluster.remote or not tracking.enabled:
        return []
    named = f"cluster profile {Path(profile).stem}" if profile else "the cluster profile"
    server = cluster.tracking_uri.strip()
    if tracking.uri.strip():
        setting, uri = "tracking.uri", tracking.uri.strip()
        fallback = f"'' for the profile's ({server})" if is_remote(server) else "'' and set the profile's tracking_uri"
        remedy = f"set it to the MLflow server's http(s):// URL (infra/mlflow), or {fallback}"
    else:
        setting, uri = f"tracking_uri of {named} (the pods' ${TRACKING_URI_ENV})", server
        where = profile if profile.endswith((".yaml", ".yml")) else "the profile"
        remedy = f"set tracking_uri in {where} (or tracking.uri) to the MLflow server's http(s):// URL"
        remedy += ", e.g. http://mlflow:5000 (infra/mlflow)"
    if is_remote(uri):
        return []
    pods = f"the pods of {named}" if setting == "tracking.uri" else "its pods"
    if not uri:
        what = f"{pods} would record into a SQLite file in the pod, lost with it"
    elif uri.startswith(("sqlite:", "file:")) or "://" not in uri:
        what = f"{pods} would record into the pod, lost with it"
    else:
        what = f"a database, not an MLflow server: {pods} would keep the run's artifacts in the pod, lost with it"
    return [f"{setting} is {uri!r}: {what}; {remedy}"]


def precision_problems(train: TrainConfig, cluster: ClusterConfig, profile: str = "") -> list[str]:
    """One line where ``train.precision: fp8`` cannot run under the cluster profile: one without GPUs. Which GPUs
    a profile's nodes hold is checked where they are: by ``pretrain run`` and ``pretrain check`` for a profile
    that trains on this machine (``cli.main``), by each rank before it starts (``training.model.fp8``).
    No torch here: this module is part of every task's cache key."""
    if train.precision != Precision.FP8 or cluster.gpus_per_node > 0:
        return []
    named = f"cluster profile {Path(profile).stem}" if profile else "the cluster profile"
    return [
        f"train.precision is 'fp8' but {named} trains on CPUs (gpus_per_node: 0); {FP8_NEEDS}: set "
        f"train.precision: bf16, or launch under a GPU profile (${CLUSTER_ENV})"
    ]


def launch_profile(path: str | None = None) -> str:
    """The cluster profile a run is launched under: ``path``, else ``$PRETRAIN_CLUSTER``, else 'local'."""
    return path or os.environ.get(CLUSTER_ENV, "") or "local"


def launch_world(path: str | None = None) -> tuple[int, str]:
    """Ranks of the train task and where the number comes from: the cluster profile at ``path``
    or ``$PRETRAIN_CLUSTER`` (nodes × ranks per node), else the local one (one node, two ranks)."""
    cluster = load_cluster(path)
    world = cluster.nnodes * cluster.nproc_per_node
    return world, f"{cluster.nnodes} node(s) × {cluster.nproc_per_node} ranks of cluster profile {launch_profile(path)}"


def profile_warning(config: PipelineConfig, source: str, profile: str) -> str:
    """The warning line when ``config`` is written for another cluster profile than ``profile``
    (a path or 'local'), else ''. Profiles compare by name: configs/cluster/gpu-2x8.yaml is gpu-2x8."""
    wanted = config.cluster_profile
    if not wanted or Path(wanted).stem == Path(profile).stem:
        return ""
    return (
        f"WARNING: {source} is written for cluster profile {Path(wanted).stem!r} but this launch uses {profile!r}: "
        f"set PRETRAIN_CLUSTER=configs/cluster/{Path(wanted).stem}.yaml (the layout and batch were checked "
        "against the world size of the profile in use, not the one the config is tuned for)"
    )


@contextmanager
def _building() -> Iterator[None]:
    token = _deferred.set(True)
    try:
        yield
    finally:
        _deferred.reset(token)


def parse_config(values: Any, source: str = "", launch: bool = True) -> PipelineConfig:
    """A PipelineConfig from nested dicts (missing keys keep their defaults), checked whole: every
    problem in one ConfigError. ``launch`` adds the rules of the machine it is launched from
    (local corpus paths, the cluster profile's world size)."""
    with _building():
        config, problems = read_settings(PipelineConfig, one_budget(values) if values is not None else {})
    if config is None:  # not a mapping: nothing else to check
        raise problems_error(problems, source)
    # Every problem at once: what could not be read, and the rules on what could (defaults standing in).
    if launch:
        world, where = launch_world()
        problems += config.problems(world, f"; {world} = {where}", load_cluster(), launch_profile())
    else:
        problems += config.problems()
    if problems:
        raise problems_error(problems, source)
    if launch and (warning := profile_warning(config, source, launch_profile())):
        print(warning, file=sys.stderr, flush=True)
    return config


def one_budget(values: Any) -> Any:
    """A train section that gives its budget in ``tokens`` only leaves ``steps`` (whose default is 300) at 0; one
    that sets both is refused by the section's check (exactly one of them)."""
    train = values.get("train") if isinstance(values, dict) else None
    readable = isinstance(train, dict) and (type(train.get("tokens")) is int or whole_number(train.get("tokens")) is not None)
    if readable and "steps" not in train:  # (an unreadable one is its own problem, the steps' default stands)
        return {**values, "train": {**train, "steps": 0}}
    return values


def load_config(path: str | Path | None, launch: bool = True, overrides: list[str] | tuple[str, ...] = ()) -> PipelineConfig:
    """A YAML preset (None: the defaults) with ``KEY=VALUE`` overrides as a checked PipelineConfig (see
    ``parse_config``)."""
    values: Any = {}
    if path is not None:
        try:
            values = yaml.safe_load(Path(path).read_text())
        except FileNotFoundError as e:
            raise ConfigError(f"config file {path} does not exist") from e
        except yaml.YAMLError as e:
            raise ConfigError(f"config file {path} is not valid YAML: {e}") from e
    source = str(path) if path is not None else "the defaults"
    if overrides:
        values = with_overrides(values, overrides)
        source += f" with {' '.join(f'--set {item}' for item in overrides)}"
    return parse_config(values, source=source, launch=launch)


def with_overrides(values: Any, overrides: list[str] | tuple[str, ...]) -> dict[str, Any]:
    """``values`` (a preset's mapping) with each ``section.key=value`` set; the value is read as YAML
    (``10`` an int, ``true`` a bool, ``[a, b]`` a list; one value for a list setting is a list of one:
    ``data.sources=/dir``), and checked with the rest by ``parse_config``."""
    values = dict(values) if isinstance(values, dict) else {}
    for item in overrides:
        key, equals, text = item.partition("=")
        parts = key.strip().split(".")
        if not equals or not all(parts):
            raise ConfigError(f"--set {item!r}: write KEY=VALUE with a dotted key, e.g. --set train.steps=10")
        try:
            value = yaml.safe_load(text)
        except yaml.YAMLError as e:
            raise ConfigError(f"--set {item!r}: the value is not valid YAML: {e}") from e
        node = values
        for part in parts[:-1]:
            child = node.get(part)
            node[part] = dict(child) if isinstance(child, dict) else {}
            node = node[part]
        node[parts[-1]] = listed(setting_type(PipelineConfig, parts), value)
        if parts[:-1] == ["train"] and parts[-1] in BUDGET:
            # The budget given one way replaces the preset's, given either way (set both: both are checked).
            other = BUDGET[1 - BUDGET.index(parts[-1])]
            if not any(o.partition("=")[0].strip() == f"train.{other}" for o in overrides):
                node[other] = 0
    return values


BUDGET = ("steps", "tokens")
