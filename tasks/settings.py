"""The workflow's first node: every setting checked together before any work is scheduled."""

from __future__ import annotations

from flytekit import task

from pipeline.cluster import ClusterConfig
from pipeline.config import PipelineConfig
from tasks import stage_log
from tasks.placement import data_task
from tasks.register import flyte_execution_id
from tasks.user_errors import as_messages


@task(**data_task())
@as_messages
def check_settings(config: PipelineConfig, world_size: int, cluster: ClusterConfig | None = None) -> None:
    """Refuse, one line per problem, a config that cannot run on ``world_size`` ranks (the train task's)
    or, under ``cluster`` (the profile the workflow was registered with), would not be tracked by its
    MLflow server.

    ``pyflyte run --config`` and ``pretrain run`` check before submitting; this node covers launches
    from the Flyte console and from launch plans, on the cluster, before the data stage starts.
    """
    stage_log.begin(local=flyte_execution_id() == "local")  # the first node: a new execution's stage lines
    where = f"; {world_size} = the train task's ranks"
    config.check(world_size, where, source="the workflow's input", cluster=cluster)
