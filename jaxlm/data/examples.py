"""Each objective's transform: stored rows, each with its own generator seeded by (seed, epoch,
index) -> the batch fields its objective declares (dynamic masks, swaps and corruptions)."""
from __future__ import annotations

from typing import Callable

import numpy as np

from jaxlm.data.denoising import (bart_target_length, check_decoder_length, check_sentinels, infill, permute_sentences,
                                  seq2seq_batch, t5_corrupt_rows, t5_input_target_lengths, t5_lengths)
from jaxlm.data.layouts import Row
from jaxlm.data.masking import TokenMasker
from jaxlm.data.packing import causal_batch, sentence_order_pair
from jaxlm.data.settings import DataConfig
from jaxlm.data.spans import mlm_batch, rows_spans_masked, whole_words

# rows and one generator per row -> the batch fields, stacked; row i depends on rows[i] and rngs[i] only
Transform = Callable[[list[Row], list[np.random.Generator]], dict]
# (manifest of the prepared rows, word-start table, data settings) -> Transform
TransformFactory = Callable[[dict, np.ndarray, DataConfig], Transform]


def word_starts(row: Row, table: np.ndarray) -> np.ndarray:
    """True where a token begins a word: by its piece, or because a stored sentence starts there."""
    starts = table[row.tokens]
    starts[row.sentence_starts[row.sentence_starts < len(starts)]] = True
    return starts


def padded_tokens(rows: list[Row], width: int) -> tuple[np.ndarray, np.ndarray]:
    """([rows, width] int32 tokens, zero past each row's end; [rows] lengths); a row of `width` tokens or more
    is a ValueError."""
    lengths = np.array([len(row.tokens) for row in rows], np.int64)
    if lengths.max(initial=0) >= width:
        raise ValueError(f"example has {lengths.max()} tokens, more than max_seq_length={width - 1}")
    tokens = np.zeros((len(rows), width), np.int32)
    for i, row in enumerate(rows):
        tokens[i, :lengths[i]] = row.tokens
    return tokens, lengths


def rows_word_starts(rows: list[Row], tokens: np.ndarray, table: np.ndarray) -> np.ndarray:
    """`word_starts` of every row of `padded_tokens` at once (anything past a row's end)."""
    starts = table[tokens]
    sentence_starts = [row.sentence_starts[row.sentence_starts < len(row.tokens)] for row in rows]
    row = np.repeat(np.arange(len(rows)), [len(s) for s in sentence_starts])
    starts[row, np.concatenate(sentence_starts).astype(np.int64)] = True
    return starts


def _mlm_settings(manifest: dict, data: DataConfig) -> dict:
    special = manifest["special_ids"]
    # BERT never masks or draws its [PAD] [CLS] [SEP] [MASK] (and does draw [UNK])
    specials = tuple(sorted({special[k] for k in ("pad", "cls", "sep", "mask") if special[k] is not None}))
    return dict(vocab_size=manifest["vocab_size"], mask_id=special["mask"], special_ids=specials,
                max_seq_length=manifest["max_seq_length"], max_predictions=data.max_predictions,
                mask_prob=data.mask_prob, pad_id=special["pad"])


def _masker(manifest: dict, table: np.ndarray, data: DataConfig):
    """(tokens, len_a, rows, rngs) -> MLM fields: whole-word masking per row, or BERT's token
    masking vectorised over the batch."""
    mlm = _mlm_settings(manifest, data)
    if not data.whole_word_masking:
        masker = TokenMasker(**mlm)
        return lambda tokens, len_a, rows, rngs: masker.batch(tokens, len_a, rngs)
    pad_id = mlm.pop("pad_id")
    return lambda tokens, len_a, rows, rngs: mlm_batch([
        whole_words(t, word_starts(r._replace(tokens=t), table), rng, len_a=a, **mlm)
        for t, a, r, rng in zip(tokens, len_a, rows, rngs)], max_seq_length=mlm["max_seq_length"],
        max_predictions=mlm["max_predictions"], pad_id=pad_id)


def nsp_transform(manifest: dict, table: np.ndarray, data: DataConfig) -> Transform:
    """BERT: masked sentence pairs, the stored next-sentence label."""
    masked = _masker(manifest, table, data)

    def transform(rows, rngs):
        out = masked([r.tokens for r in rows], [r.len_a for r in rows], rows, rngs)
        return out | {"nsp_label": np.array([r.label for r in rows], np.int32)}

    return transform


def sop_transform(manifest: dict, table: np.ndarray, data: DataConfig) -> Transform:
    """ALBERT: masked sentence pairs, swapped half of the time (sentence-order prediction)."""
    masked, special = _masker(manifest, table, data), manifest["special_ids"]

    def transform(rows, rngs):
        pairs = [sentence_order_pair(r.tokens[1:r.len_a - 1], r.tokens[r.len_a:-1], rng, cls_id=special["cls"],
                                     sep_id=special["sep"]) for r, rng in zip(rows, rngs)]
        out = masked([p[0] for p in pairs], [p[1] for p in pairs], rows, rngs)
        return out | {"nsp_label": np.array([p[2] for p in pairs], np.int32)}

    return transform


def sentence_mlm_transform(manifest: dict, table: np.ndarray, data: DataConfig) -> Transform:
    """RoBERTa, DistilBERT: dynamic masking of full-sentence rows, one segment."""
    masked = _masker(manifest, table, data)

    def transform(rows, rngs):
        out = masked([r.tokens for r in rows], [len(r.tokens) for r in rows], rows, rngs)
        del out["segment_ids"]
        return out

    return transform


def span_transform(manifest: dict, table: np.ndarray, data: DataConfig) -> Transform:
    """SpanBERT: geometric spans of whole words masked, with their boundary positions."""
    mlm = _mlm_settings(manifest, data)
    pad_id, seq = mlm.pop("pad_id"), mlm["max_seq_length"]
    if data.max_span > seq:
        raise ValueError(f"data.max_span={data.max_span} exceeds data.max_seq_length={seq}: a span of more words than "
                         f"a row has tokens never fits; give at most {seq} (SpanBERT: 10)")

    def transform(rows, rngs):
        tokens, lengths = padded_tokens(rows, mlm["max_seq_length"] + 1)
        masked = rows_spans_masked(tokens, lengths, rows_word_starts(rows, tokens, table), rngs, p=data.span_p,
                                   max_span=data.max_span, **mlm)
        return mlm_batch(masked, max_seq_length=mlm["max_seq_length"], max_predictions=mlm["max_predictions"],
                         pad_id=pad_id)

    return transform


def causal_transform(manifest: dict, table: np.ndarray, data: DataConfig) -> Transform:
    """GPT-2, Llama: next-token targets of packed rows (no randomness)."""
    seq, eos = manifest["max_seq_length"], manifest["special_ids"]["eos"]
    return lambda rows, rngs: causal_batch([row.tokens for row in rows], seq, eos)


def _pad_id(special: dict) -> int:
    return special["pad"] if special["pad"] is not None else 0


def t5_transform(manifest: dict, table: np.ndarray, data: DataConfig) -> Transform:
    """T5: span corruption of raw chunks, one sentinel per span."""
    special, seq = manifest["special_ids"], manifest["max_seq_length"]
    pad, target = _pad_id(special), t5_lengths(data)[1]
    exact = t5_input_target_lengths(data.max_seq_length, data.noise_density, data.mean_span_length)[1]
    check_decoder_length(data, exact, "T5's span-corruption targets")

    sentinels = np.asarray(special["sentinels"], np.int64)
    check_sentinels(data, len(sentinels))

    def transform(rows, rngs):
        inputs, targets = t5_corrupt_rows([row.tokens for row in rows], rngs, sentinel_ids=sentinels,
                                          eos_id=special["eos"], noise_density=data.noise_density,
                                          mean_span_length=data.mean_span_length)
        return seq2seq_batch(inputs, targets, max_seq_length=seq, max_target_length=target, pad_id=pad,
                             decoder_start_id=pad)

    return transform


def bart_transform(manifest: dict, table: np.ndarray, data: DataConfig) -> Transform:
    """BART: sentence permutation then text infilling; the targets are the stored row."""
    special, seq = manifest["special_ids"], manifest["max_seq_length"]
    pad, target = _pad_id(special), bart_target_length(data)
    check_decoder_length(data, seq, "BART's targets (its stored rows, data.max_seq_length)")

    def corrupt(row, rng):
        inner = row.tokens[1:-1]
        if data.permute_sentences:
            bounds = np.append(row.sentence_starts - 1, len(inner))
            inner = permute_sentences([inner[s:e] for s, e in zip(bounds[:-1], bounds[1:])], rng)
        inputs = infill(inner, rng, mask_id=special["mask"], mask_ratio=data.mask_ratio,
                        poisson_lambda=data.poisson_lambda)
        return np.concatenate([row.tokens[:1], inputs, row.tokens[-1:]])

    def transform(rows, rngs):
        return seq2seq_batch([corrupt(row, rng) for row, rng in zip(rows, rngs)], [row.tokens for row in rows],
                             max_seq_length=seq, max_target_length=target, pad_id=pad,
                             decoder_start_id=special["eos"])

    return transform
