"""Experiment tracking: every pipeline execution mirrored as an MLflow run, the registry as MLflow
registered models. The store stays the source of truth; MLflow is a view of it. Flyte-free."""
