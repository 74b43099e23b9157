"""BERT dynamic masked-LM masking of [CLS] A [SEP] B [SEP] rows (one, or a batch at once) into padded model inputs."""
from __future__ import annotations

import dataclasses
import functools
from typing import Iterable

import numpy as np


def random_non_special(rng: np.random.Generator, size: int, vocab_size: int,
                       special_ids: Iterable[int]) -> np.ndarray:
    """Token ids drawn uniformly from [0, vocab_size) without the special ids."""
    shifted = _shifted_specials(vocab_size, tuple(special_ids))
    return _skip_specials(rng.integers(vocab_size - len(shifted), size=size), shifted)


@functools.lru_cache(maxsize=64)
def _shifted_specials(vocab_size: int, special_ids: tuple[int, ...]) -> np.ndarray:
    """The in-vocabulary special ids, sorted, each less the number before it: where `_skip_specials`
    steps over them."""
    specials = np.array(sorted({s for s in special_ids if 0 <= s < vocab_size}), dtype=np.int64)
    return specials - np.arange(len(specials))


@functools.lru_cache(maxsize=16)
def non_special(vocab_size: int, special_ids: tuple[int, ...]) -> np.ndarray:
    """[vocab_size] bool: True at every id but the special ones (the ids masking may choose)."""
    table = np.ones(vocab_size, bool)
    table[[s for s in special_ids if 0 <= s < vocab_size]] = False
    return table


def _smallest_first(keys: np.ndarray, k: int) -> np.ndarray:
    """[rows, k]: the column indices of each row's k smallest keys, smallest first; as a full argsort's
    first k columns (for distinct keys), in a third of its time at 512 columns."""
    part = np.argpartition(keys, k - 1, axis=1)[:, :k]
    return np.take_along_axis(part, np.argsort(np.take_along_axis(keys, part, 1), axis=1, kind="stable"), 1)


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
        shifted = _shifted_specials(self.vocab_size, tuple(self.special_ids))
        object.__setattr__(self, "_non_special", non_special(self.vocab_size, tuple(self.special_ids)))
        object.__setattr__(self, "_shifted", shifted)
        object.__setattr__(self, "_draw_range", self.vocab_size - len(shifted))

    def __call__(self, tokens: np.ndarray, len_a: int, rng: np.random.Generator) -> dict[str, np.ndarray]:
        return {k: v[0] for k, v in self.batch([tokens], [len_a], [rng]).items()}

    def batch(self, rows: list[np.ndarray], len_a: list[int], rngs: list[np.random.Generator]) -> dict[str, np.ndarray]:
        """Masks rows[i] with rngs[i] alone (one draw of uniforms each, the same whatever the batch),
        then everything else vectorised over the batch: the chosen positions are the `num` candidates
        with the smallest uniform keys, sorted; one uniform each picks [MASK]/random/keep, another
        the random id."""
        seq, preds, b = self.max_seq_length, self.max_predictions, len(rows)
        lengths = np.array([len(r) for r in rows])
        if lengths.max(initial=0) > seq:
            raise ValueError(f"example has {lengths.max()} tokens, more than max_seq_length={seq}")
        tokens = np.full((b, seq), self.pad_id, np.int32)
        uniforms = np.empty((b, seq + 2 * preds))
        for i, (row, rng) in enumerate(zip(rows, rngs)):
            tokens[i, :len(row)] = row
            rng.random(out=uniforms[i])
        column = np.arange(seq)
        real = column < lengths[:, None]
        candidates = real & self._non_special[tokens]
        count = candidates.sum(1)
        num = np.minimum(np.minimum(preds, np.maximum(1, np.round(count * self.mask_prob).astype(int))), count)
        keys = np.where(candidates, uniforms[:, :seq], 2.0)
        chosen = np.arange(preds) < num[:, None]
        positions = np.sort(np.where(chosen, _smallest_first(keys, preds), seq), axis=1)
        positions = np.where(chosen, positions, 0).astype(np.int32)
        labels = np.where(chosen, np.take_along_axis(tokens, positions, 1), 0).astype(np.int32)

        action = uniforms[:, seq:seq + preds]
        random_ids = _skip_specials((uniforms[:, seq + preds:] * self._draw_range).astype(np.int64), self._shifted)
        replacement = np.where(action < 0.8, self.mask_id, np.where(action < 0.9, random_ids, labels))
        input_ids = tokens.copy()
        r, c = np.nonzero(chosen)
        input_ids[r, positions[r, c]] = replacement[r, c]
        return {"input_ids": input_ids,
                "segment_ids": (real & (column >= np.asarray(len_a)[:, None])).astype(np.int32),
                "input_mask": real.astype(np.int32), "masked_positions": positions, "masked_labels": labels,
                "masked_weights": chosen.astype(np.float32)}


def mask_example(tokens: np.ndarray, len_a: int, rng: np.random.Generator, *, vocab_size: int,
                 mask_id: int, special_ids: Iterable[int], max_seq_length: int,
                 max_predictions: int, mask_prob: float = 0.15, pad_id: int = 0) -> dict[str, np.ndarray]:
    """`TokenMasker` for one example (pipelines build the masker once)."""
    return TokenMasker(vocab_size, mask_id, tuple(special_ids), max_seq_length, max_predictions, mask_prob,
                       pad_id)(tokens, len_a, rng)
