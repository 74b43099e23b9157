"""Labelled records into fixed-length rows: one or two segments with their special tokens, truncation as
Hugging Face's `longest_first`, padding; and the rows of a batch (weight-0 padding rows included)."""
from __future__ import annotations

import dataclasses
import math

import numpy as np

from jaxlm.data.tokenizers.roles import special_ids


@dataclasses.dataclass
class Rows:
    """`arrays` [N, ...] per objective field; `owner[i]` the record row i came from (a long QA context
    gives several rows); `meta[i]` what decoding row i's outputs needs (word ids, windows)."""

    arrays: dict[str, np.ndarray]
    owner: np.ndarray
    meta: list

    def __len__(self) -> int:
        return len(self.owner)


def stack(rows: list[dict], owner: list[int], meta: list) -> Rows:
    if not rows:
        raise ValueError("no examples to encode")
    return Rows({name: np.stack([row[name] for row in rows]) for name in rows[0]}, np.asarray(owner), meta)


def is_weight(name: str) -> bool:
    """Fields that say how much a row counts: a padding row has them all zero."""
    return name.endswith(("_weight", "_weights"))


def fitted_batch(asked: int, rows: int, shards: int) -> int:
    """`asked` rows a batch, or where that is more than `rows`, the fewest in whole shards that hold them all:
    the rest would be weight-0 padding, which costs compute and memory and changes no result."""
    if asked <= rows:
        return asked
    return min(asked, math.ceil(rows / shards) * shards)


def batch_rows(rows: Rows, indices: np.ndarray, size: int) -> dict[str, np.ndarray]:
    """The rows at `indices`, then copies of the first with every weight 0 up to `size` rows."""
    fill = size - len(indices)
    batch = {}
    for name, values in rows.arrays.items():
        taken = values[indices]
        if fill:
            padding = np.repeat(values[indices[:1]], fill, axis=0)
            if is_weight(name):
                padding = np.zeros_like(padding)
            taken = np.concatenate([taken, padding])
        batch[name] = taken
    return batch


def truncate_longest_first(a: list[int], b: list[int], budget: int) -> tuple[list[int], list[int]]:
    """Both segments cut from their ends to fit `budget` as Hugging Face's truncation="longest_first"
    does: the shorter one (the first, on a tie) keeps up to half the budget, the other the rest."""
    if len(a) + len(b) <= budget:
        return list(a), list(b)
    if len(a) <= len(b):
        keep_a = min(len(a), budget // 2)
        return list(a[:keep_a]), list(b[:budget - keep_a])
    keep_b = min(len(b), budget // 2)
    return list(a[:budget - keep_b]), list(b[:keep_b])


class PairEncoder:
    """[CLS] a [SEP] (b [SEP]) rows for an encoder, its tokenizer's special tokens and the model's
    segment ids (B's are 1 where the model has segment embeddings)."""

    def __init__(self, tokenizer, max_length: int, segments: bool, pair_separators: int = 1):
        special = special_ids(tokenizer)
        if special["cls"] is None or special["sep"] is None:
            raise ValueError("the tokenizer has no [CLS]/[SEP] (or <s>/</s>) tokens that an encoder's rows start "
                             "and end with")
        self.tokenizer, self.max_length, self.segments = tokenizer, max_length, segments
        self.cls, self.sep, self.pair_separators = special["cls"], special["sep"], pair_separators
        self.pad = special["pad"] if special["pad"] is not None else 0

    def ids(self, text: str) -> list[int]:
        return self.tokenizer.encode(text)

    def encode(self, a: list[int], b: list[int] | None = None) -> dict[str, np.ndarray]:
        """input_ids, segment_ids and input_mask [max_length] of ids `a` (and `b`), truncated."""
        if b is None:
            a = a[:self.max_length - 2]
            ids, segments = [self.cls, *a, self.sep], [0] * (len(a) + 2)
        else:
            a, b = truncate_longest_first(a, b, self.max_length - 2 - self.pair_separators)
            ids = [self.cls, *a, *[self.sep] * self.pair_separators, *b, self.sep]
            segments = [0] * (len(a) + 1 + self.pair_separators) + [int(self.segments)] * (len(b) + 1)
        return self.pad_row(ids, segments)

    def pad_row(self, ids: list[int], segments: list[int]) -> dict[str, np.ndarray]:
        return pad_row(ids, segments, self.max_length, self.pad)


def pad_row(ids: list[int], segments: list[int], length: int, pad: int) -> dict[str, np.ndarray]:
    """input_ids, segment_ids and input_mask [length], padded on the right."""
    row = {"input_ids": np.full(length, pad, np.int32), "segment_ids": np.zeros(length, np.int32),
           "input_mask": np.zeros(length, np.int32)}
    row["input_ids"][:len(ids)], row["segment_ids"][:len(ids)], row["input_mask"][:len(ids)] = ids, segments, 1
    return row


class DecoderEncoder:
    """A decoder's rows: the text's ids (a pair joined by the end-of-text token), cut at max_length,
    padded on the right with the tokenizer's pad token (without one, transformers' decoder heads
    cannot batch either)."""

    def __init__(self, tokenizer, max_length: int):
        special = special_ids(tokenizer)
        if special["pad"] is None:
            raise ValueError("the tokenizer has no pad token, which a decoder's sequence head pads its rows with; "
                             "use a tokenizer that defines one (e.g. SmolLM2's)")
        self.tokenizer, self.max_length, self.pad, self.eos = tokenizer, max_length, special["pad"], special["eos"]

    def ids(self, text: str) -> list[int]:
        return self.tokenizer.encode(text)

    def encode(self, a: list[int], b: list[int] | None = None) -> dict[str, np.ndarray]:
        ids = list(a) if b is None else [*a, *([self.eos] if self.eos is not None else []), *b]
        ids = ids[:self.max_length]
        return pad_row(ids, [0] * len(ids), self.max_length, self.pad)
