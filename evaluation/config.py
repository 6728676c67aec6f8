"""The evaluation's settings (the ``evaluation`` section of the pipeline config). Torch-free."""

from __future__ import annotations

from dataclasses import dataclass, field

from common.docfields import documented
from common.settings import at_least
from evaluation.lm_eval_catalog import shipped_tasks


@documented
@dataclass
class EvalConfig:
    """Held-out evaluation."""

    batch_size: int = 16
    """Validation sequences per forward pass."""
    max_batches: int = 16
    """Batches evaluated at most (0 = the whole validation split)."""
    sample_tokens: int = 48
    """Tokens generated from the prompt (greedily, and sampled) for the model card."""
    prompt: str = "def main():\n"
    """Prompt of the samples."""
    temperature: float = 0.8
    """Temperature of the sampled (non-greedy) continuation."""
    seed: int = 0
    """Seed of the sampled continuation: the same checkpoint gives the same text."""
    lm_eval_tasks: list[str] = field(default_factory=lambda: ["heldout_cloze", "heldout_continuation"])
    """lm-evaluation-harness tasks run on the Hugging Face export, built from the held-out split
    (evaluation/lm_eval_tasks/; [] = none). Their figures reach the card as lm_eval.<task>.<metric>."""
    lm_eval_examples: int = 64
    """Examples per lm-eval task at most (drawn from the held-out passages)."""
    lm_eval_seed: int = 0
    """Seed that draws the lm-eval examples: the same dataset and seed give the same examples."""

    def problems(self) -> list[str]:
        """Every setting of this section that cannot work, one line each."""
        out = at_least("evaluation.batch_size", self.batch_size, 1)
        out += at_least("evaluation.lm_eval_examples", self.lm_eval_examples, 1)
        shipped = shipped_tasks()
        for task in self.lm_eval_tasks:
            if task not in shipped:
                out.append(f"evaluation.lm_eval_tasks names {task!r}: not a shipped task; use some of {', '.join(shipped)} or []")
        if len(set(self.lm_eval_tasks)) != len(self.lm_eval_tasks):
            out.append(f"evaluation.lm_eval_tasks {self.lm_eval_tasks} names a task twice: name each once")
        out += at_least("evaluation.max_batches", self.max_batches, 0, " (0 = the whole validation split)")
        out += at_least("evaluation.sample_tokens", self.sample_tokens, 0)
        out += at_least("evaluation.temperature", self.temperature, 0, " (0 = greedy)")
        if self.sample_tokens and not self.prompt:
            out.append("evaluation.prompt is '': the samples continue it; give one or set evaluation.sample_tokens: 0")
        return out
