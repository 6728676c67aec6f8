"""Document masking inside packed sequences (``train.document_masking``), as Llama 3 and torchtitan train.

A packed row holds the end of one document, whole documents, and the start of another, each ended by the
end-of-text token. With masking each token attends only to the tokens of its own document at or before it
(a block-diagonal causal mask), its RoPE position counts from its document's first token, and the position
holding a document's end-of-text token is not trained to predict the next document's first token (that
token's only context would be another document). Computed from the rows alone, on every pipeline stage
and for every micro-batch, so the data and its shards stay as prepared.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class Documents:
    """What a micro-batch of ``[batch, seq]`` input ids needs for document masking."""

    positions: torch.Tensor
    """``[batch, seq]`` each token's position within its document."""
    attention_mask: torch.Tensor
    """``[batch, 1, seq, seq]`` bool, True where a query must not attend to a key (megatron's convention)."""
    loss_mask: torch.Tensor
    """``[batch, seq]`` bool, False where the input is end-of-text (its label starts another document)."""


def trained(inputs: torch.Tensor, eod_id: int) -> torch.Tensor:
    """Where ``inputs`` has a trained position: everywhere but end-of-text, whose label starts another document
    (the loss mask, and the tokens that weigh each micro-batch: ``training.model.shared.token_weights``)."""
    return inputs != eod_id


def documents(inputs: torch.Tensor, eod_id: int) -> Documents:
    """The documents of ``inputs`` (``[batch, seq]``), each ending with ``eod_id``, which belongs to the
    document it ends."""
    eod = inputs == eod_id
    index = torch.arange(inputs.shape[1], device=inputs.device)
    # A document starts at the row's first token and after each end-of-text token.
    starts = torch.zeros_like(eod)
    starts[:, 0] = True
    starts[:, 1:] = eod[:, :-1]
    first = torch.where(starts, index, torch.zeros_like(index)).cummax(dim=1).values
    document = starts.long().cumsum(dim=1)
    same = document.unsqueeze(2) == document.unsqueeze(1)
    causal = index.unsqueeze(1) >= index.unsqueeze(0)
    return Documents(positions=index - first, attention_mask=~(same & causal).unsqueeze(1), loss_mask=trained(inputs, eod_id))
