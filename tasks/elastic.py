"""Flyte's ``Elastic`` task, whose error names the rank that failed first.

flytekitplugins-kfpytorch reports torch's ``ChildFailedError`` as it comes: the rank whose process
exited first, which is often a peer whose collective failed ("Connection closed by peer") while the
rank that failed first was still writing its error. ``FirstFailureElastic`` is the same task config
(the same serialized task, the same PyTorchJob), run by a task class that turns that error into
``training.failures.JobFailed``: the first line names the first failing rank (as the ranks recorded
it), its own error and its traceback, and whether Flyte may retry follows that rank's error. Where
that rank's error was a ``UserError`` (a full store, a bad loss), the task raises a
``training.failures.RankUserError``: one line, which ``pretrain run`` prints as it prints any user error.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

from flytekit.core.task import TaskPlugins
from flytekit.exceptions.user import FlyteRecoverableException, FlyteUserRuntimeException
from flytekitplugins.kfpytorch import Elastic
from flytekitplugins.kfpytorch.error_handling import RECOVERABLE_ERROR_FILE_NAME
from flytekitplugins.kfpytorch.task import PytorchElasticFunctionTask
from torch.distributed.elastic.multiprocessing.errors import ChildFailedError

from common.errors import UserError
from training.failures import job_failure


@dataclass
class FirstFailureElastic(Elastic):
    """``Elastic``, whose task's error names the rank that failed first (see the module)."""


class FirstFailureElasticTask(PytorchElasticFunctionTask):
    """The plugin's task; only its error differs."""

    def _execute(self, **kwargs) -> Any:
        try:
            return super()._execute(**kwargs)
        except (FlyteRecoverableException, FlyteUserRuntimeException) as e:
            # The plugin raises these while handling the ChildFailedError, which stays their context.
            if not isinstance(e.__context__, ChildFailedError):
                raise
            failed = job_failure(e.__context__)
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
