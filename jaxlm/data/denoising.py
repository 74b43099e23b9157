"""Encoder-decoder corruptions: T5 span corruption, BART text infilling and sentence permutation."""
from __future__ import annotations

import functools
from typing import NamedTuple, Sequence

import numpy as np

from jaxlm.models.bart import shift_tokens_right


def seq2seq_batch(inputs: Sequence[np.ndarray], targets: Sequence[np.ndarray], *, max_seq_length: int,
                  max_target_length: int, pad_id: int, decoder_start_id: int) -> dict[str, np.ndarray]:
    """The padded fields of `Seq2SeqObjective` for a batch of (inputs, targets) token sequences, stacked;
    decoder inputs are the targets shifted right."""
    input_lengths = np.array([len(x) for x in inputs])
    target_lengths = np.array([len(x) for x in targets])
    if input_lengths.max(initial=0) > max_seq_length or target_lengths.max(initial=0) > max_target_length:
        row = int(np.argmax((input_lengths > max_seq_length) | (target_lengths > max_target_length)))
        raise ValueError(f"corrupted example has {input_lengths[row]} input and {target_lengths[row]} target tokens, "
                         f"more than max_seq_length={max_seq_length} / max_target_length={max_target_length}")

    def padded(sequences, lengths, size):
        out = np.full((len(sequences), size), pad_id, np.int32)
        filled = np.arange(size) < lengths[:, None]
        if len(sequences):
            out[filled] = np.concatenate(sequences)
        return out, filled

    input_ids, input_mask = padded(inputs, input_lengths, max_seq_length)
    target_ids, target_mask = padded(targets, target_lengths, max_target_length)
    return {"input_ids": input_ids, "input_mask": input_mask.astype(np.int32),
            "decoder_input_ids": shift_tokens_right(target_ids, pad_id, decoder_start_id),
            "targets": target_ids, "target_weights": target_mask.astype(np.float32)}


def seq2seq_arrays(inputs: np.ndarray, targets: np.ndarray, *, max_seq_length: int,
                   max_target_length: int, pad_id: int, decoder_start_id: int) -> dict[str, np.ndarray]:
    """`seq2seq_batch` of one example."""
    batch = seq2seq_batch([np.asarray(inputs)], [np.asarray(targets)], max_seq_length=max_seq_length,
                          max_target_length=max_target_length, pad_id=pad_id, decoder_start_id=decoder_start_id)
    return {name: value[0] for name, value in batch.items()}


def random_segmentation_starts(num_items: int, num_segments: int, rng: np.random.Generator) -> np.ndarray:
    """T5's `_random_segmentation` as its one draw: [num_items - 1] bools, True where items 1.. begin a new
    segment of a uniformly random split of num_items into num_segments non-empty segments."""
    return rng.permutation(np.arange(num_items - 1) < num_segments - 1)


def segment_lengths(starts: np.ndarray, num_segments: int) -> np.ndarray:
    """[rows, num_segments] segment lengths of [rows, num_items - 1] `random_segmentation_starts`."""
    rows = len(starts)
    segment = np.zeros((rows, starts.shape[1] + 1), np.int64)
    np.cumsum(starts, axis=1, out=segment[:, 1:])
    segment += np.arange(rows)[:, None] * num_segments
    return np.bincount(segment.reshape(-1), minlength=rows * num_segments).reshape(rows, num_segments)


@functools.lru_cache(maxsize=1024)
def t5_noise_counts(length: int, noise_density: float, mean_span_length: float) -> tuple[int, int]:
    """(noise tokens, noise spans) as T5 computes them (round half to even, like tf.round)."""
    length = max(length, 2)
    num_noise = min(max(round(length * noise_density), 1), length - 1)
    return num_noise, max(round(num_noise / mean_span_length), 1)


def random_spans_noise_masks(length: int, rngs: Sequence[np.random.Generator], noise_density: float = 0.15,
                             mean_span_length: float = 3.0) -> np.ndarray:
    """T5's `random_spans_noise_mask` of a row of `length` for each generator, [rows, length]: alternating
    non-noise / noise spans, starting non-noise. Each row draws its noise, then its non-noise split."""
    num_noise, num_spans = t5_noise_counts(length, noise_density, mean_span_length)
    num_kept = max(length, 2) - num_noise
    noise_starts = np.empty((len(rngs), num_noise - 1), bool)
    kept_starts = np.empty((len(rngs), num_kept - 1), bool)
    for i, rng in enumerate(rngs):
        noise_starts[i] = random_segmentation_starts(num_noise, num_spans, rng)
        kept_starts[i] = random_segmentation_starts(num_kept, num_spans, rng)
    interleaved = np.empty((len(rngs), 2 * num_spans), np.int64)
    interleaved[:, 0::2] = segment_lengths(kept_starts, num_spans)
    interleaved[:, 1::2] = segment_lengths(noise_starts, num_spans)
    # span j covers [ends[j - 1], ends[j]); odd spans are noise. Starts are counted, as T5's segment sum counts
    # them: where there are more spans than kept tokens some kept spans are empty, and two starts at one position
    # leave its parity as it was (the noise spans on either side of an empty one merge)
    span_starts = np.zeros((len(rngs), max(length, 2) + 1), np.int64)
    np.add.at(span_starts, (np.arange(len(rngs))[:, None], np.cumsum(interleaved[:, :-1], axis=1)), 1)
    return (np.cumsum(span_starts, axis=1)[:, :length] % 2).astype(bool)


def t5_input_target_lengths(inputs_length: int, noise_density: float = 0.15,
                            mean_span_length: float = 3.0) -> tuple[int, int]:
    """T5's `random_spans_helper`: (raw tokens per example, targets length) such that span
    corruption of that many tokens gives exactly `inputs_length` inputs (one sentinel per span
    plus EOS on each side). The counts are the mask's (T5's helper left out its one span at the least, so a mean
    span longer than the noise overflowed the inputs by a token)."""
    def lengths(tokens_length: int) -> tuple[int, int]:
        num_noise, num_spans = t5_noise_counts(tokens_length, noise_density, mean_span_length)
        return tokens_length - num_noise + num_spans + 1, num_noise + num_spans + 1

    tokens_length = inputs_length - 1
    while lengths(tokens_length + 1)[0] <= inputs_length:
        tokens_length += 1
    targets_length = lengths(tokens_length)[1]
    if noise_density == 0.5 and targets_length > inputs_length:
        tokens_length, targets_length = tokens_length - 1, targets_length - 1
    return tokens_length, targets_length


def t5_lengths(data) -> tuple[int, int]:
    """(raw tokens per stored row, decoder length) of T5 span corruption for a DataConfig; a set
    data.max_target_length replaces the exact decoder length."""
    raw, target = t5_input_target_lengths(data.max_seq_length, data.noise_density, data.mean_span_length)
    return raw, data.max_target_length or target


def bart_target_length(data) -> int:
    """BART's decoder length for a DataConfig: data.max_target_length, else max_seq_length."""
    return data.max_target_length or data.max_seq_length


def check_decoder_length(data, needed: int, what: str) -> None:
    """ValueError where a set data.max_target_length cannot hold the `needed` tokens of `what`, the longest
    targets a pretraining transform makes (checked when the transform is built, before any batch)."""
    if 0 < data.max_target_length < needed:
        raise ValueError(f"data.max_target_length={data.max_target_length} is shorter than {what}, {needed} "
                         f"tokens; raise it, or set 0 for exactly that length")


def check_sentinels(data, sentinels: int) -> None:
    """ValueError where T5's span corruption of a stored row (a DataConfig's) makes more noise spans than the
    tokenizer's `sentinels` ids, one per span."""
    raw = t5_lengths(data)[0]
    noise, spans = t5_noise_counts(raw, data.noise_density, data.mean_span_length)
    spans = min(spans, raw - noise)  # spans beyond the kept tokens' count merge with their neighbours
    if spans > sentinels:
        raise ValueError(f"T5's span corruption makes {spans} noise spans in a row of {raw} tokens, one sentinel id "
                         f"each, but the tokenizer has {sentinels}; set data.sentinels={spans} or more (T5 has "
                         "100), or raise data.mean_span_length")


def _replace_spans(tokens: np.ndarray, mask: np.ndarray, sentinel_ids: Sequence[int]) -> np.ndarray:
    """T5's `noise_span_to_unique_sentinel` for [rows, length] tokens and masks with the same number of masked
    tokens and spans in every row: each masked span becomes its sentinel; [rows, kept tokens + spans]."""
    first = mask.copy()
    first[:, 1:] &= ~mask[:, :-1]
    spans = first.sum(1)
    if spans.max(initial=0) > len(sentinel_ids):
        raise ValueError(f"{int(spans.max())} noise spans but only {len(sentinel_ids)} sentinel ids")
    out = tokens.copy()
    out[first] = np.asarray(sentinel_ids)[np.cumsum(first, axis=1)[first] - 1]
    return out[first | ~mask].reshape(len(tokens), -1)


def t5_span_corruption(tokens: np.ndarray, rng: np.random.Generator, *, sentinel_ids: Sequence[int],
                       eos_id: int, noise_density: float = 0.15, mean_span_length: float = 3.0,
                       max_seq_length: int | None = None, max_target_length: int | None = None,
                       pad_id: int = 0, decoder_start_id: int = 0) -> dict[str, np.ndarray]:
    """T5's span corruption: inputs = the kept tokens with sentinel_ids[i] for noise span i, + EOS;
    targets = sentinel_ids[i] then span i, for every span, + EOS. Lengths default to the exact
    ones of `t5_input_target_lengths` for len(tokens)."""
    inputs, targets = t5_corrupt(tokens, rng, sentinel_ids=sentinel_ids, eos_id=eos_id, noise_density=noise_density,
                                 mean_span_length=mean_span_length)
    return seq2seq_arrays(inputs, targets, max_seq_length=max_seq_length or len(inputs),
                          max_target_length=max_target_length or len(targets), pad_id=pad_id,
                          decoder_start_id=decoder_start_id)


def t5_corrupt(tokens: np.ndarray, rng: np.random.Generator, *, sentinel_ids: Sequence[int], eos_id: int,
               noise_density: float = 0.15, mean_span_length: float = 3.0) -> tuple[np.ndarray, np.ndarray]:
    """(inputs, targets) of `t5_span_corruption`, unpadded."""
    inputs, targets = t5_corrupt_rows([tokens], [rng], sentinel_ids=sentinel_ids, eos_id=eos_id,
                                      noise_density=noise_density, mean_span_length=mean_span_length)
    return inputs[0], targets[0]


def t5_corrupt_rows(rows: Sequence[np.ndarray], rngs: Sequence[np.random.Generator], *, sentinel_ids: Sequence[int],
                    eos_id: int, noise_density: float = 0.15,
                    mean_span_length: float = 3.0) -> tuple[list[np.ndarray], list[np.ndarray]]:
    """`t5_corrupt` of rows[i] with rngs[i] alone, for every row, the rows of each length at once (their
    inputs, and their targets, are then all of one length)."""
    inputs: list = [None] * len(rows)
    targets: list = [None] * len(rows)
    by_length: dict[int, list[int]] = {}
    for i, row in enumerate(rows):
        by_length.setdefault(len(row), []).append(i)
    for length, members in by_length.items():
        tokens = np.array([rows[i] for i in members], np.int32).reshape(len(members), length)
        mask = random_spans_noise_masks(length, [rngs[i] for i in members], noise_density, mean_span_length)
        eos = np.full((len(members), 1), eos_id, np.int32)
        corrupted = np.concatenate([_replace_spans(tokens, mask, sentinel_ids), eos], axis=1)
        spans = np.concatenate([_replace_spans(tokens, ~mask, sentinel_ids), eos], axis=1)
        for k, i in enumerate(members):
            inputs[i], targets[i] = corrupted[k], spans[k]
    return inputs, targets


class Infill(NamedTuple):
    starts: np.ndarray  # where each span begins in the original, ascending
    lengths: np.ndarray  # its realised length (0: a mask inserted before `start`)
    drawn: np.ndarray  # its length as drawn; differs only where the last draw was cut to the budget


def sample_infill_spans(length: int, rng: np.random.Generator, *, mask_ratio: float = 0.3,
                        poisson_lambda: float = 3.0) -> Infill:
    """BART's span lengths: Poisson draws until they cover round(mask_ratio * length) tokens, the
    last one cut to that budget (fairseq's DenoisingDataset). The spans are then placed disjointly,
    uniformly at random: a random interleaving of the spans with the unmasked tokens."""
    budget = int(round(length * mask_ratio))
    drawn: list[int] = []
    total = 0
    while total < budget:
        more = rng.poisson(poisson_lambda, size=max(1, budget // max(1, int(poisson_lambda)))).tolist()
        drawn.extend(more)
        total += sum(more)
    covered = np.cumsum(drawn)
    count = int(np.searchsorted(covered, budget)) + 1 if budget else 0
    drawn_arr = np.array(drawn[:count], np.int64)
    lengths = drawn_arr.copy()
    if count:
        lengths[-1] = budget - (covered[count - 2] if count > 1 else 0)
    # an empty span inserts a mask: no more of them than the other spans' masks save (the last drawn go), so that
    # the inputs are never longer than the row (a small poisson_lambda drew enough to overflow it)
    empty = np.flatnonzero(lengths == 0)
    surplus = len(empty) - int((lengths[lengths > 0] - 1).sum())
    if surplus > 0:
        kept = np.ones(count, bool)
        kept[empty[len(empty) - surplus:]] = False
        lengths, drawn_arr, count = lengths[kept], drawn_arr[kept], int(kept.sum())
    order = rng.permutation(count)
    lengths, drawn_arr = lengths[order], drawn_arr[order]
    # slot i of the interleaving holds span i or an unmasked token
    is_span = np.zeros(length - budget + count, bool)
    is_span[np.sort(rng.choice(len(is_span), size=count, replace=False))] = True
    span_slots = np.flatnonzero(is_span)
    starts = span_slots - np.arange(count) + np.cumsum(lengths) - lengths
    return Infill(starts.astype(np.int64), lengths, drawn_arr)


def infill(tokens: np.ndarray, rng: np.random.Generator, *, mask_id: int, mask_ratio: float = 0.3,
           poisson_lambda: float = 3.0) -> np.ndarray:
    """BART's text infilling of `tokens`: each span of `sample_infill_spans` becomes one mask token
    (placed before the first kept token at or after the span's start)."""
    tokens = np.asarray(tokens, np.int32)
    n = len(tokens)
    spans = sample_infill_spans(n, rng, mask_ratio=mask_ratio, poisson_lambda=poisson_lambda)
    masks_before = np.bincount(spans.starts, minlength=n + 1)
    cover = masks_before - np.bincount(spans.starts + spans.lengths, minlength=n + 1)
    keep = np.cumsum(cover[:n]) == 0
    emitted = masks_before + np.append(keep, False)  # what each position writes: its masks, then itself
    out = np.full(int(emitted.sum()), mask_id, np.int32)
    out[(np.cumsum(emitted) - 1)[:n][keep]] = tokens[keep]
    return out


def permute_sentences(sentences: Sequence[Sequence[int]], rng: np.random.Generator) -> np.ndarray:
    """BART's sentence permutation: the sentences in a uniformly random order, concatenated."""
    order = rng.permutation(len(sentences)).tolist()
    if not order:
        return np.zeros(0, np.int32)
    return np.concatenate([np.asarray(sentences[i], np.int32) for i in order]).astype(np.int32, copy=False)


def bart_text_infilling(tokens: np.ndarray, rng: np.random.Generator, *, mask_id: int,
                        mask_ratio: float = 0.3, poisson_lambda: float = 3.0, max_seq_length: int,
                        max_target_length: int, pad_id: int = 1, decoder_start_id: int = 2) -> dict[str, np.ndarray]:
    """`infill` as a seq2seq example (the caller frames `tokens` with BOS/EOS); the target is the original."""
    inputs = infill(tokens, rng, mask_id=mask_id, mask_ratio=mask_ratio, poisson_lambda=poisson_lambda)
    return seq2seq_arrays(inputs, np.asarray(tokens, np.int32), max_seq_length=max_seq_length,
                          max_target_length=max_target_length, pad_id=pad_id, decoder_start_id=decoder_start_id)


def bart_sentence_permutation(sentences: Sequence[Sequence[int]], rng: np.random.Generator, *,
                              max_seq_length: int, max_target_length: int, pad_id: int = 1,
                              decoder_start_id: int = 2) -> dict[str, np.ndarray]:
    """`permute_sentences` as a seq2seq example; the target is the original order."""
    original = np.array([t for s in sentences for t in s], np.int32)
    return seq2seq_arrays(permute_sentences(sentences, rng), original, max_seq_length=max_seq_length,
                          max_target_length=max_target_length, pad_id=pad_id, decoder_start_id=decoder_start_id)
