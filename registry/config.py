"""The registry's settings (the ``registry`` section of the pipeline config) and the names it reserves."""

from __future__ import annotations

from dataclasses import dataclass

from common.docfields import documented
from common.names import name_problem
from evaluation.lm_eval_catalog import metric_name, parse_metric_name, shipped_tasks

LATEST = "latest"
"""The alias every registration moves to its version (forward only): no gate may take it."""
DEFAULT_GATE_METRIC = "bits_per_byte"
"""The quality gate's default figure."""


def setting_name_problem(path: str, value: str, alias: bool = False) -> list[str]:
    """The setting ``path`` as a registry name or alias: the rule of ``common.names``, which the
    registry enforces too."""
    problem = name_problem(value, alias=alias)
    return [f"{path} is {value!r}: {problem}"] if problem else []


@documented
@dataclass
class RegistryConfig:
    """Where and under which name the trained model is registered."""

    model_name: str = "gpt-tiny"
    """Registry name of the model (versions are numbered within it)."""
    gate_alias: str = "production"
    """Alias the quality gate guards: a candidate takes it only if it is not worse than its holder."""
    gate_tolerance: float = 0.0
    """How much worse than the alias holder a candidate may be on gate_metric and still take it, in
    that metric's units (bits per byte; for acc, a fraction of the examples)."""
    gate_metric: str = DEFAULT_GATE_METRIC
    """The figure the gate compares, candidate and holder measured on the same data: bits_per_byte
    (lower is better) or lm_eval.<task>.<metric> of a task in evaluation.lm_eval_tasks, e.g.
    lm_eval.heldout_continuation.acc (acc, acc_norm: higher is better; perplexity: lower)."""

    def problems(self) -> list[str]:
        """Every setting of this section that cannot work, one line each (see common.settings)."""
        out = setting_name_problem("registry.model_name", self.model_name)
        out += setting_name_problem("registry.gate_alias", self.gate_alias, alias=True)
        if self.gate_alias == LATEST:
            out.append(f"registry.gate_alias is {LATEST!r}: the registry moves it to each new version; use production")
        if self.gate_metric != DEFAULT_GATE_METRIC:
            parsed = parse_metric_name(self.gate_metric)
            shipped = shipped_tasks()
            known = [metric_name(t, m) for t, metrics in shipped.items() for m in metrics]
            if parsed is None or parsed[0] not in shipped or parsed[1] not in shipped[parsed[0]]:
                out.append(
                    f"registry.gate_metric is {self.gate_metric!r}: use {DEFAULT_GATE_METRIC} or an lm-eval figure, "
                    f"one of {', '.join(known)}"
                )
        return out
