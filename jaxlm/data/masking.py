"""BERT dynamic masked-LM masking of one [CLS] A [SEP] B [SEP] example into padded model inputs."""
from __future__ import annotations

from typing import Iterable

import numpy as np


def random_non_special(rng: np.random.Generator, size: int, vocab_size: int,
                       special_ids: Iterable[int]) -> np.ndarray:
    """Token ids drawn uniformly from [0, vocab_size) without the special ids."""
    specials = np.array(sorted({s for s in special_ids if 0 <= s < vocab_size}), dtype=np.int64)
    draws = rng.integers(vocab_size - len(specials), size=size)
    shifted = specials - np.arange(len(specials))
    return (draws + np.searchsorted(shifted, draws, side="right")).astype(np.int32)


def mask_example(tokens: np.ndarray, len_a: int, rng: np.random.Generator, *, vocab_size: int,
                 mask_id: int, special_ids: Iterable[int], max_seq_length: int,
                 max_predictions: int, mask_prob: float = 0.15, pad_id: int = 0) -> dict[str, np.ndarray]:
    """Chooses ~mask_prob of the non-special tokens; 80% -> [MASK], 10% -> random id, 10% kept."""
    tokens = np.asarray(tokens, dtype=np.int32)
    n = len(tokens)
    if n > max_seq_length:
        raise ValueError(f"example has {n} tokens, more than max_seq_length={max_seq_length}")
    special_ids = tuple(special_ids)
    is_candidate = np.ones(n, dtype=bool)
    for special in special_ids:
        is_candidate &= tokens != special
    candidates = np.flatnonzero(is_candidate)
    num = min(max_predictions, max(1, int(round(len(candidates) * mask_prob))), len(candidates))
    positions = np.sort(rng.choice(candidates, size=num, replace=False)) if num else candidates[:0]
    labels = tokens[positions]

    inputs = tokens.copy()
    action = rng.random(num)
    inputs[positions[action < 0.8]] = mask_id
    randomized = positions[(action >= 0.8) & (action < 0.9)]
    if len(randomized):
        inputs[randomized] = random_non_special(rng, len(randomized), vocab_size, special_ids)

    input_ids = np.full(max_seq_length, pad_id, np.int32)
    input_ids[:n] = inputs
    segment_ids = np.zeros(max_seq_length, np.int32)
    segment_ids[len_a:n] = 1
    input_mask = np.zeros(max_seq_length, np.int32)
    input_mask[:n] = 1
    masked_positions = np.zeros(max_predictions, np.int32)
    masked_positions[:num] = positions
    masked_labels = np.zeros(max_predictions, np.int32)
    masked_labels[:num] = labels
    masked_weights = np.zeros(max_predictions, np.float32)
    masked_weights[:num] = 1.0
    return {"input_ids": input_ids, "segment_ids": segment_ids, "input_mask": input_mask,
            "masked_positions": masked_positions, "masked_labels": masked_labels,
            "masked_weights": masked_weights}
