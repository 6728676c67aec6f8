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
    request_timeout_s: float = 5.0
    """Seconds one request to the tracking server may take before it counts as failed (then retried later)."""
    flush_s: float = 5.0
    """Seconds the end of training waits for buffered step records to reach MLflow (the rest: the last task sends them)."""
    retry_s: float = 60.0
    """Seconds the pipeline's last task keeps retrying an unreachable tracking server before it warns and succeeds."""

    def problems(self) -> list[str]:
        """Every setting of this section that cannot work, one line each (see common.settings)."""
        out = []
        if not self.experiment.strip():
            out.append("tracking.experiment is '': name the MLflow experiment, e.g. pretrain")
        for name in ("request_timeout_s", "flush_s", "retry_s"):
            value = getattr(self, name)
            if not value > 0:
                out.append(f"tracking.{name} is {value}: use a number of seconds above 0, e.g. {getattr(TrackingConfig, name)}")
        return out
