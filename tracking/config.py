"""The ``tracking`` section of the pipeline config."""

from __future__ import annotations

from dataclasses import dataclass

from common.docfields import documented


@documented
@dataclass
class TrackingConfig:
    """Where runs are recorded for comparison (MLflow)."""

    enabled: bool = True
    """Record each execution as an MLflow run and mirror registered versions (false = store only)."""
    uri: str = ""
    """MLflow tracking URI ('' = $MLFLOW_TRACKING_URI, else a SQLite database beside the default store)."""
    experiment: str = "pretrain"
    """MLflow experiment the runs are recorded in."""

    def problems(self) -> list[str]:
        """Every setting of this section that cannot work, one line each (see common.settings)."""
        out = []
        if not self.experiment.strip():
            out.append("tracking.experiment is '': name the MLflow experiment, e.g. pretrain")
        return out
