"""Flyte's ``Elastic`` task, whose ranks start from a fork server and whose error names the rank
that failed first.

**Fork server.** The plugin starts each rank with ``spawn``: a fresh interpreter that imports the
launching script, flytekit, torch and megatron-core again (10–15 s of CPU a rank, every launch and
every elastic restart). ``start_method="forkserver"`` (the default here; the plugin knows only
``spawn`` and ``fork``) runs the plugin's own ``spawn_helper`` in ranks forked from a server that has
loaded torch and megatron-core once (``training.launch.fork_server_args``), with the launching
process's environment, working folder and standard streams. Not ``fork`` itself: the launching
process holds threads, an SQLite connection and pooled S3 connections a rank must not share.

**First failure.** flytekitplugins-kfpytorch reports torch's ``ChildFailedError`` as it comes: the
rank whose process exited first, which is often a peer whose collective failed ("Connection closed
by peer") while the rank that failed first was still writing its error. ``FirstFailureElastic`` is
the same task config (the same serialized task, the same PyTorchJob), run by a task class that turns
that error into ``training.observe.failures.JobFailed``: the first line names the first failing rank (as the
ranks recorded it), its own error and its traceback, and whether Flyte may retry follows that rank's
error. Where that rank's error was a ``UserError`` (a full store, a bad loss), the task raises a
``training.observe.failures.RankUserError``: one line, which ``pretrain run`` prints as it prints any user error.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass
from typing import Any

import cloudpickle
import flytekit
from flytekit.core.context_manager import FlyteContextManager
from flytekit.core.task import TaskPlugins
from flytekit.deck.deck import TimeLineDeck
from flytekit.exceptions.user import FlyteRecoverableException, FlyteUserRuntimeException
from flytekit.extend import IgnoreOutputs
from flytekit.loggers import logger
from flytekitplugins.kfpytorch import Elastic
from flytekitplugins.kfpytorch.error_handling import RECOVERABLE_ERROR_FILE_NAME
from flytekitplugins.kfpytorch.task import PytorchElasticFunctionTask, spawn_helper
from torch.distributed.elastic.multiprocessing.errors import ChildFailedError

from common.errors import UserError
from training.launch import fork_server_args, from_fork_server
from training.observe.failures import job_failure


@dataclass
class FirstFailureElastic(Elastic):
    """``Elastic``, whose ranks start from a fork server and whose task's error names the rank that
    failed first (see the module). ``start_method`` may also be the plugin's ``spawn`` or ``fork``."""

    start_method: str = "forkserver"
    monitor_interval: float = 0.2
    """Seconds between the agent's looks at its ranks (the plugin's 5): a job that ended waited up to this
    long to be seen ended, and a failed rank to be seen failed, before its ranks restart in place (0.5 until
    restarts in place came). torchrun's own default is 0.1."""
    restarts_input: str = ""
    """The task input (an int) that sets ``max_restarts`` for each launch (with the fork server), where the task's
    static ``max_restarts`` is the PyTorchJob's as registered; '' = the static one."""
    around_launch: Callable[[dict[str, Any]], AbstractContextManager[Any]] | None = None
    """Called with the task's inputs, the launcher process runs the ranks inside what it returns (with the
    fork server; the environment it sets there is the ranks'): the train task's live MLflow feed."""


PRELOAD = ("flytekitplugins.kfpytorch.task",)
"""What the fork server loads beyond ``training.rank_preload`` for this task's ranks: the plugin's ``spawn_helper``
(flytekit with it), which each rank imported on its own: about a CPU-second a rank, eight ranks a node on a cluster."""


class FirstFailureElasticTask(PytorchElasticFunctionTask):
    """The plugin's task; only how ranks start and its error differ."""

    def _execute(self, **kwargs) -> Any:
        try:
            if self.task_config.start_method == "forkserver":
                return self._execute_from_fork_server(**kwargs)
            return super()._execute(**kwargs)
        except ChildFailedError as e:
            self._raise_first_failure(e)
        except (FlyteRecoverableException, FlyteUserRuntimeException) as e:
            # The plugin raises these while handling the ChildFailedError, which stays their context.
            if not isinstance(e.__context__, ChildFailedError):
                raise
            self._raise_first_failure(e.__context__)

    def _execute_from_fork_server(self, **kwargs) -> Any:
        """The plugin's ``spawn`` path (its launch config, ``spawn_helper`` in each rank, rank 0's result,
        Decks and output metadata kept; nothing from another node's group), with forked ranks."""
        from torch.distributed.elastic.multiprocessing.api import SignalException
        from torch.distributed.launcher.api import LaunchConfig, elastic_launch

        if "OMP_NUM_THREADS" not in os.environ and self.task_config.nproc_per_node > 1:
            os.environ["OMP_NUM_THREADS"] = "1"  # as torchrun and the plugin do
        ctx = flytekit.current_context()
        config = LaunchConfig(
            run_id=ctx.execution_id.name,
            min_nodes=self.min_nodes,
            max_nodes=self.max_nodes,
            nproc_per_node=self.task_config.nproc_per_node,
            rdzv_backend=self.rdzv_backend,
            rdzv_configs=self.task_config.rdzv_configs,
            rdzv_endpoint=os.environ.get("PET_RDZV_ENDPOINT", "localhost:0"),
            max_restarts=int(kwargs.get(self.task_config.restarts_input, self.task_config.max_restarts)),
            monitor_interval=self.task_config.monitor_interval,
            start_method="forkserver",
        )
        try:
            checkpoint_dest, checkpoint_src = ctx.checkpoint._checkpoint_dest, ctx.checkpoint._checkpoint_src
        except NotImplementedError:  # no Flyte checkpoint in this execution
            checkpoint_dest = checkpoint_src = None
        helper_args = (cloudpickle.dumps(self._task_function), ctx.raw_output_prefix, checkpoint_dest, checkpoint_src, kwargs)
        around = self.task_config.around_launch
        # The seconds before the first step line (ranks forked, process groups, the model built) say what they are.
        nodes = f" × {self.max_nodes} nodes" if self.max_nodes > 1 else ""
        print(f"{self.name.rsplit('.', 1)[-1]}: starting {config.nproc_per_node} ranks{nodes} (torch elastic)", flush=True)
        try:
            with around(kwargs) if around is not None else nullcontext():
                out = elastic_launch(config, from_fork_server)(*fork_server_args(spawn_helper, *helper_args, preload=PRELOAD))
        except SignalException as e:
            logger.exception(f"Elastic launch agent process terminating: {e}")
            raise IgnoreOutputs() from None
        if 0 not in out:  # another node's group: rank 0's node reports the outputs
            raise IgnoreOutputs()
        for deck in out[0].decks:
            if not isinstance(deck, TimeLineDeck):
                ctx.decks.append(deck)
        if out[0].om:
            FlyteContextManager.current_context().output_metadata_tracker.add(out[0].return_value, out[0].om)
        return out[0].return_value

    def _raise_first_failure(self, error: ChildFailedError) -> None:
        failed = job_failure(error)
        rank, reported = failed.get_first_failure()
        error_file = failed.first.error_file if failed.first is not None else reported.error_file
        # The plugin's worker wrapper marks a recoverable error next to that rank's error file.
        if error_file and os.path.exists(os.path.join(os.path.dirname(error_file), RECOVERABLE_ERROR_FILE_NAME)):
            raise FlyteRecoverableException(str(failed), timestamp=failed.timestamp) from None
        if isinstance(failed, UserError):
            # As any task's user error: Flyte prefixes the task's name (locally) or wraps it (remotely:
            # the error's time is then Flyte's, not the rank's); the cause is the job's whole report.
            raise failed from failed.__cause__
        raise FlyteUserRuntimeException(failed, timestamp=failed.timestamp) from None


TaskPlugins.register_pythontask_plugin(FirstFailureElastic, FirstFailureElasticTask)
