"""Per-example generators `np.random.default_rng([seed, epoch, index])` for a whole batch at once.

numpy builds each generator's PCG64 from `SeedSequence(key).generate_state(4, uint64)`: a fixed
hash of the key's uint32 words, 12-18 µs a row in numpy's per-scalar code (a third of BERT's whole
example at 128). Here the same hash runs over the batch's keys as uint32 vector arithmetic (numpy's
SeedSequence algorithm, pool of 4 words; its output is under numpy's stable-stream guarantee) and
each PCG64 is seeded from its row of words: the same generators, 3-5 µs a row. Keys whose parts do
not each fit one uint32 word go through numpy itself."""
from __future__ import annotations

from collections.abc import Iterator, Sequence

import numpy as np
from numpy.random.bit_generator import ISeedSequence

_POOL = 4
_INIT_A, _MULT_A = 0x43B0D7E5, 0x931E8875  # mixing the entropy into the pool
_INIT_B, _MULT_B = 0x8B51F9DD, 0x58F38DED  # drawing the state from the pool
_MIX_LEFT, _MIX_RIGHT = 0xCA01F9DD, 0x4973F715
_MASK32 = 0xFFFFFFFF


class _Hash:
    """SeedSequence's hashmix: each call XORs the running constant in, steps it, multiplies by it."""

    def __init__(self, constant: int, multiplier: int):
        self.constant, self.multiplier = constant, multiplier

    def __call__(self, value: np.ndarray) -> np.ndarray:
        value = value ^ np.uint32(self.constant)
        self.constant = (self.constant * self.multiplier) & _MASK32
        value = value * np.uint32(self.constant)
        return value ^ (value >> np.uint32(16))


def _mix(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    result = np.uint32(_MIX_LEFT) * x - np.uint32(_MIX_RIGHT) * y
    return result ^ (result >> np.uint32(16))


def seed_states(keys: np.ndarray) -> np.ndarray:
    """[N, 4] uint64: `SeedSequence(keys[i]).generate_state(4, np.uint64)` for [N, W] uint32 keys, W <= 4."""
    keys = np.asarray(keys, np.uint32)
    hashmix = _Hash(_INIT_A, _MULT_A)
    zeros = np.zeros(len(keys), np.uint32)
    pool = [hashmix(keys[:, i] if i < keys.shape[1] else zeros) for i in range(_POOL)]
    for source in range(_POOL):
        for target in range(_POOL):
            if source != target:
                pool[target] = _mix(pool[target], hashmix(pool[source]))
    draw = _Hash(_INIT_B, _MULT_B)
    words = np.stack([draw(pool[i % _POOL]) for i in range(2 * _POOL)], axis=1)
    return words.astype("<u4").view("<u8").astype(np.uint64)


class _Drawn(ISeedSequence):
    """A seed sequence whose state is already drawn: what PCG64 asks of it."""

    def __init__(self, state: np.ndarray):
        self.state = state

    def generate_state(self, n_words: int, dtype=np.uint32) -> np.ndarray:
        if (n_words, np.dtype(dtype)) != (len(self.state), self.state.dtype):
            raise ValueError(f"drawn {len(self.state)} {self.state.dtype} words, asked for {n_words} {np.dtype(dtype)}")
        return self.state


def row_generators(seed: int, epoch: int, indices) -> list[np.random.Generator]:
    """One generator per example, seeded by (seed, epoch, index): `np.random.default_rng([seed, epoch, index])`."""
    indices = [int(i) for i in indices]
    if not all(0 <= x <= _MASK32 for x in (seed, epoch, *indices)):
        return [np.random.default_rng([seed, epoch, i]) for i in indices]
    keys = np.empty((len(indices), 3), np.uint32)
    keys[:, 0], keys[:, 1], keys[:, 2] = seed, epoch, indices
    return [np.random.Generator(np.random.PCG64(_Drawn(state))) for state in seed_states(keys)]


class RowGenerators(Sequence):
    """`row_generators(seed, epoch, indices)`, built on first use: a transform that draws nothing (the causal
    LM's) does not pay for them (1.2 ms of a 5 ms GPT-2 batch of 256 at 512)."""

    def __init__(self, seed: int, epoch: int, indices):
        self._key, self._generators = (seed, epoch, indices), None

    def _built(self) -> list[np.random.Generator]:
        if self._generators is None:
            self._generators = row_generators(*self._key)
        return self._generators

    def __len__(self) -> int:
        return len(self._key[2])

    def __getitem__(self, i):
        return self._built()[i]

    def __iter__(self) -> Iterator[np.random.Generator]:
        return iter(self._built())
