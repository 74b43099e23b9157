"""BERT dynamic masked-LM masking of one [CLS] A [SEP] B [SEP] example into padded model inputs."""
from __future__ import annotations

import dataclasses
from typing import Iterable

import numpy as np


def random_non_special(rng: np.random.Generator, size: int, vocab_size: int,
                       special_ids: Iterable[int]) -> np.ndarray:
    """Token ids drawn uniformly from [0, vocab_size) without the special ids."""
    specials = np.array(sorted({s for s in special_ids if 0 <= s < vocab_size}), dtype=np.int64)
    return _skip_specials(rng.integers(vocab_size - len(specials), size=size), specials - np.arange(len(specials)))


def _skip_specials(draws: np.ndarray, shifted_specials: np.ndarray) -> np.ndarray:
    return (draws + np.searchsorted(shifted_specials, draws, side="right")).astype(np.int32)


@dataclasses.dataclass(frozen=True)
class TokenMasker:
    """BERT's masking with its tables built once: choose ~mask_prob of the non-special tokens;
    80% -> [MASK], 10% -> a random non-special id, 10% kept."""
    vocab_size: int
    mask_id: int
    special_ids: tuple[int, ...]
    max_seq_length: int
    max_predictions: int
    mask_prob: float = 0.15
    pad_id: int = 0

    def __post_init__(self):
        specials = np.array(sorted({s for s in self.special_ids if 0 <= s < self.vocab_size}), np.int64)
        is_special = np.zeros(self.vocab_size, bool)
        is_special[specials] = True
        object.__setattr__(self, "_is_special", is_special)
        object.__setattr__(self, "_shifted", specials - np.arange(len(specials)))
        object.__setattr__(self, "_draw_range", self.vocab_size - len(specials))

    def __call__(self, tokens: np.ndarray, len_a: int, rng: np.random.Generator) -> dict[str, np.ndarray]:
        tokens = np.asarray(tokens, dtype=np.int32)
        n, seq, preds = len(tokens), self.max_seq_length, self.max_predictions
        if n > seq:
            raise ValueError(f"example has {n} tokens, more than max_seq_length={seq}")
        candidates = np.flatnonzero(~self._is_special[tokens])
        num = min(preds, max(1, int(round(len(candidates) * self.mask_prob))), len(candidates))
        positions = np.sort(rng.choice(candidates, size=num, replace=False)) if num else candidates[:0]

        input_ids = np.full(seq, self.pad_id, np.int32)
        input_ids[:n] = tokens
        action = rng.random(num)
        input_ids[positions[action < 0.8]] = self.mask_id
        randomized = positions[(action >= 0.8) & (action < 0.9)]
        if len(randomized):
            input_ids[randomized] = _skip_specials(rng.integers(self._draw_range, size=len(randomized)), self._shifted)
        segment_ids = np.zeros(seq, np.int32)
        segment_ids[len_a:n] = 1
        input_mask = np.zeros(seq, np.int32)
        input_mask[:n] = 1
        masked_positions = np.zeros(preds, np.int32)
        masked_positions[:num] = positions
        masked_labels = np.zeros(preds, np.int32)
        masked_labels[:num] = tokens[positions]
        masked_weights = np.zeros(preds, np.float32)
        masked_weights[:num] = 1.0
        return {"input_ids": input_ids, "segment_ids": segment_ids, "input_mask": input_mask,
                "masked_positions": masked_positions, "masked_labels": masked_labels,
                "masked_weights": masked_weights}


def mask_example(tokens: np.ndarray, len_a: int, rng: np.random.Generator, *, vocab_size: int,
                 mask_id: int, special_ids: Iterable[int], max_seq_length: int,
                 max_predictions: int, mask_prob: float = 0.15, pad_id: int = 0) -> dict[str, np.ndarray]:
    """`TokenMasker` for one example (pipelines build the masker once)."""
    return TokenMasker(vocab_size, mask_id, tuple(special_ids), max_seq_length, max_predictions, mask_prob,
                       pad_id)(tokens, len_a, rng)
