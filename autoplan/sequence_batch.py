"""A causal language model's batch for a sequence split over ranks (context parallel).

A causal LM shifts its labels by one token and numbers its positions from 0 itself; both
read the sequence in its own order. A sequence split in a load-balanced order
(``dtensor/context_attention.py``) holds tokens out of order, so the batch brings them
made beforehand, in the whole sequence's order: ``position_ids`` and ``shift_labels``
(each label already moved to the token that predicts it, the last one ignored), the
keyword arguments transformers' causal LMs take for this (their loss reads
``shift_labels`` instead of shifting ``labels``). ``apply/engine.py`` ``shard_batch``
then reorders and splits them with the tokens. An all-ones ``attention_mask`` says there
is no padding: transformers then runs attention with ``is_causal`` and builds no mask;
given position ids and no mask, it would take positions out of order for packed
sequences and build a block mask from them.
"""

from __future__ import annotations

import torch

IGNORE_INDEX = -100  # transformers' (and torch's cross_entropy's) default
ADDED_KEYS = ("position_ids", "shift_labels", "attention_mask")
"""What ``causal_lm_batch`` adds to token ids and labels: a model without a split sequence
makes them itself, and a plan without one is solved on the batch without them (traced,
a mask the model cannot read makes it build a causal mask the run never has)."""


def causal_lm_batch(input_ids: torch.Tensor, labels: torch.Tensor, ignore_index: int = IGNORE_INDEX) -> dict:
    """``input_ids``, ``labels``, ``position_ids``, ``shift_labels`` and an all-ones
    ``attention_mask`` of a (batch, sequence) batch, for a model whose sequence may be split."""
    batch, seq_len = input_ids.shape
    shifted = torch.full_like(labels, ignore_index)
    shifted[:, :-1] = labels[:, 1:]
    positions = torch.arange(seq_len, device=input_ids.device).expand(batch, seq_len).clone()
    return dict(input_ids=input_ids, labels=labels, position_ids=positions, shift_labels=shifted,
                attention_mask=torch.ones_like(input_ids))


def without_added_keys(batch: dict) -> dict:
    """``batch`` as the model takes it when its sequence is not split: ``ADDED_KEYS`` left out."""
    return {key: value for key, value in batch.items() if key not in ADDED_KEYS}
