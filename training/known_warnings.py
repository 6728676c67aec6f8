"""Warnings megatron-core and torch print on every run that nobody can act on, filtered where they start.

Without these filters, whichever process imports megatron-core or reads a distributed checkpoint prints
the same blocks: that Apex and Transformer Engine are absent (we run without them on purpose: their CPU
fallbacks are what we use), a deprecated ``cuda_graph_scope`` default inside megatron's own config, and
torch's deprecation of ``ShardedTensor``, which megatron's checkpoint loader still uses. The evaluation
printed ten of them from the second run on (when it also loads the model that holds ``production``), the
ranks printed them only where the fork server had not imported megatron already, so one run printed none
and the next a screenful, and a reader took them for a fault.

``install()`` runs when the ``training`` package is imported, before any module of ours imports
megatron-core, in every process: the launcher, the fork server, each rank, the evaluation. Each filter
names its warning's category, module and message, so a new warning from the same places still shows.
"""

from __future__ import annotations

import warnings

KNOWN: tuple[tuple[type[Warning], str, str], ...] = (
    # Apex and Transformer Engine absent: megatron falls back to torch's norm, optimizers and multi-tensor ops.
    (UserWarning, r"megatron\.", r"(Transformer Engine and Apex|Apex) (are|is) not installed"),
    # megatron's advice for overlapping TP communication on GPUs, printed by every rank of every run (filtered by
    # the train task's module-wide filter until 2026-12-07); on the CPU it means nothing.
    (UserWarning, r"megatron\.core\.tensor_parallel\.layers", r"When using async grad allreduce it is recommended"),
    # megatron's TransformerConfig warns about its own default cuda_graph_scope.
    (UserWarning, r"megatron\.core\.transformer\.transformer_config", r"full scope is deprecated"),
    # megatron's torch_dist checkpoint loader calls torch's deprecated load_state_dict, with ShardedTensors.
    (FutureWarning, r"megatron\.core\.dist_checkpointing", r"`load_state_dict` is deprecated"),
    (FutureWarning, r"torch\.distributed\.checkpoint", r"Please use DTensor instead and we are deprecating ShardedTensor"),
)
"""(category, module pattern, message pattern) of each warning left out: the patterns match the start of the
module that warns and of the message, as ``warnings.filterwarnings`` reads them."""


def install() -> None:
    """Ignore the ``KNOWN`` warnings in this process (idempotent: ``filterwarnings`` replaces an equal filter)."""
    for category, module, message in KNOWN:
        warnings.filterwarnings("ignore", message=message, category=category, module=module)
