"""The step lines a training run prints (rank 0): every ``train.log_every`` steps, the first and the last
step of the call, and every skipped step."""

from __future__ import annotations

from training.callbacks import Record, StepCallback


def step_line(record: Record, steps: int) -> str:
    line = (
        f"step {record['step']:>5}/{steps} | loss {record['loss']:.4f} | lr {record['lr']:.2e} | "
        f"grad_norm {record['grad_norm']:.3f} | {record['tokens_per_s']:,.0f} tok/s"
    )
    if record.get("mfu") is not None:
        line += f" | MFU {record['mfu']:.1%}"
    line += f" | data {record['data_wait_fraction']:.0%}"
    if record.get("peak_memory_mib") is not None:  # training.observe.metrics.peak_memory_mib: the GPU's, or the process's RSS
        line += f" | mem {record['peak_memory_mib']:,.0f} MiB"
    if "heldout_loss" in record:  # training.validator: a few batches, not the evaluation's val_loss
        line += f" | heldout {record['heldout_loss']:.4f} ({record['heldout_batches']} batches)"
    if "slowest_rank" in record:  # a straggler exchange ended with this step
        line += f" | slowest rank {record['slowest_rank']} ({record['slowest_ratio']:.2f}× the others)"
    if "skipped" in record:
        line += " | SKIPPED (bad loss)"
    return line


def startup_line(
    parameters: int, non_embedding: int, flops_per_token: float, tokens_per_step: int, world_size: int, device: str
) -> str:
    """What trains, before its first step (rank 0): the model's size and cost, the step's tokens, the ranks.
    ``flops_per_token`` is the model FLOPs of one trained token (``training.observe.metrics``; MFU's numerator)."""
    return (
        f"model: {_si(parameters)} parameters ({_si(non_embedding)} non-embedding), "
        f"{_si(flops_per_token)}FLOPs per token (forward + backward); "
        f"{tokens_per_step:,} tokens per step on {world_size} rank{'s' if world_size != 1 else ''} ({device})"
    )


def _si(n: float) -> str:
    """1.9 M, 11.6 G: three significant figures and a unit, as people read model sizes."""
    for unit, scale in (("T", 1e12), ("G", 1e9), ("M", 1e6), ("k", 1e3)):
        if abs(n) >= scale:
            return f"{n / scale:.3g} {unit}"
    return f"{n:.3g} "


class StepLines(StepCallback):
    """Prints the step lines; give it after the callbacks whose figures the line shows."""

    def __init__(self, steps: int, log_every: int) -> None:
        self.steps, self.log_every = steps, log_every
        self.printed_any = False

    def after_step(self, record: Record) -> None:
        step = record["step"]
        if not self.printed_any or step % self.log_every == 0 or step == self.steps or "skipped" in record:
            print(step_line(record, self.steps), flush=True)
            self.printed_any = True
