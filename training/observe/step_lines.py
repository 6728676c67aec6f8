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
    if "val_loss" in record:
        line += f" | val_loss {record['val_loss']:.4f}"
    if "slowest_rank" in record:  # a straggler exchange ended with this step
        line += f" | slowest rank {record['slowest_rank']} ({record['slowest_ratio']:.2f}× the others)"
    if "skipped" in record:
        line += " | SKIPPED (bad loss)"
    return line


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
