"""Thin Flyte tasks: each turns its config section into library calls and returns a typed record.

Every process that runs a task imports this package first (``pyflyte run``, a pod's ``pyflyte-execute``, a rank
unpickling its task): the collector runs less often there from here on (``common.collector``)."""

from common.collector import collect_less_often

collect_less_often()

from tasks import schemas  # noqa: E402

schemas.install()
