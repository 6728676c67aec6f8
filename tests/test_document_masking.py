"""Document masking (issue 48 item 3): inside a packed row each token sees its own document only, its RoPE
position counts from its document's start, and no position learns a document's first token from another.
Real models, fresh weights, at TP=2 and PP=2 (gloo ranks)."""

from __future__ import annotations

import pytest
import torch

from tests.helpers import document_logits, tiny_model
from training.launch import launch
from training.model.documents import documents

EOD, VOCAB = 3, 96
MODEL = tiny_model()


def test_documents_split_at_end_of_text_which_ends_its_own_document():
    inputs = torch.tensor([[5, 6, EOD, 7, 8, 9, EOD, 4], [5, 6, 7, 8, 9, 10, 11, 12]])
    docs = documents(inputs, EOD)
    assert docs.positions.tolist() == [[0, 1, 2, 0, 1, 2, 3, 0], list(range(8))]
    assert docs.loss_mask.tolist() == [[True, True, False, True, True, True, False, True], [True] * 8]
    allowed = ~docs.attention_mask[0, 0]
    # Token 4 (the second document's second token) sees tokens 3-4; the end-of-text at 6 sees 3-6; token 7 itself.
    assert allowed[4].nonzero().flatten().tolist() == [3, 4]
    assert allowed[6].nonzero().flatten().tolist() == [3, 4, 5, 6]
    assert allowed[7].nonzero().flatten().tolist() == [7]
    assert torch.equal(~docs.attention_mask[1, 0], torch.ones(8, 8, dtype=torch.bool).tril())  # one document: causal


def packed(previous: list[int], nxt: list[int]) -> list[int]:
    return [*previous, EOD, *nxt]


# Two rows differing only in the document before the end-of-text; the next document is the same in both.
NEXT = [11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21, 22, 23, 24, 25, 26]
ROWS = [packed([40 + i for i in range(15)], NEXT), packed([70 - i for i in range(15)], NEXT)]
START = 16  # the next document's first position


@pytest.mark.slow
@pytest.mark.parametrize(("tp", "pp"), [(2, 1), (1, 2)], ids=["tensor-parallel-2", "pipeline-parallel-2"])
def test_the_previous_document_changes_no_logit_of_the_next_one_only_with_masking(tp, pp):
    masked = torch.tensor(launch(document_logits, tp * pp, MODEL, tp, pp, ROWS, VOCAB, EOD))
    plain = torch.tensor(launch(document_logits, tp * pp, MODEL, tp, pp, ROWS, VOCAB, None))
    assert masked.shape == plain.shape == (2, 32, VOCAB)
    assert torch.equal(masked[0, START:], masked[1, START:])  # bit for bit: the other document is invisible
    assert (plain[0, START:] - plain[1, START:]).abs().max() > 1e-3  # without masking it shows through
    # The next document's logits are those of the document alone at the start of a row, bit for bit: its positions
    # restart at 0. (RoPE is relative: positions 16-31 would give the same numbers but for rounding, 1e-7 here.)
    # Two rows, as ROWS: the same shapes take the same kernels' summation order.
    alone = torch.tensor(launch(document_logits, tp * pp, MODEL, tp, pp, [NEXT + NEXT] * 2, VOCAB, EOD))
    assert torch.equal(masked[0, START:], alone[0, :16])
