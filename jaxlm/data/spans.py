"""Word-level masking for encoders: BERT whole-word masking and SpanBERT span masking."""
from __future__ import annotations

import bisect
import functools
from typing import Iterable, NamedTuple

import numpy as np

from jaxlm.data.masking import non_special, random_non_special


def candidate_mask(tokens: np.ndarray, special_ids: Iterable[int], vocab_size: int) -> np.ndarray:
    """True where a token may be masked (it is not a special token)."""
    return non_special(vocab_size, tuple(special_ids))[tokens]


def word_bounds(word_starts: np.ndarray, candidates: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(starts, ends) of every candidate word: a start token plus its continuations, never
    spanning a special token (a continuation right after a special starts its own word)."""
    starts_mask = candidates.copy()
    starts_mask[1:] &= np.asarray(word_starts[1:], bool) | ~candidates[:-1]
    # a word ends at the next word start or special token (or the row's end), whichever comes first
    boundaries = np.flatnonzero(np.append(starts_mask | ~candidates, True))
    is_start = starts_mask[boundaries[:-1]]
    return boundaries[:-1][is_start], boundaries[1:][is_start]


def rows_word_bounds(word_starts: np.ndarray, candidates: np.ndarray) -> list[tuple[np.ndarray, np.ndarray]]:
    """`word_bounds` of every row of [rows, width] matrices at once (a row's candidates False past its end,
    and width longer than every row), in a few array operations instead of a few per row."""
    rows, width = candidates.shape
    starts_mask = candidates.copy()
    starts_mask[:, 1:] &= word_starts[:, 1:] | ~candidates[:, :-1]
    # the first position past each row's end is a boundary, so no word runs into the next row
    boundaries = np.flatnonzero(starts_mask | ~candidates)
    is_start = starts_mask.reshape(-1)[boundaries[:-1]]
    starts, ends = boundaries[:-1][is_start], boundaries[1:][is_start]
    row = starts // width
    cuts = np.searchsorted(row, np.arange(1, rows))
    return list(zip(np.split(starts - row * width, cuts), np.split(ends - row * width, cuts)))


def prediction_budget(num_candidates: int, mask_prob: float, max_predictions: int) -> int:
    num_candidates = int(num_candidates)  # round() of a numpy scalar costs ten times a Python float's
    return min(max_predictions, max(1, round(num_candidates * mask_prob)), num_candidates)


def apply_actions(tokens: np.ndarray, groups: list[tuple[int, int]], rng: np.random.Generator, *,
                  vocab_size: int, mask_id: int, special_ids: Iterable[int]) -> np.ndarray:
    """BERT's 80% [MASK] / 10% random / 10% unchanged, one draw per group (a word or span: the
    tokens start..end)."""
    inputs = tokens.copy()
    replaced = []
    for (start, end), a in zip(groups, rng.random(len(groups)).tolist()):
        if a < 0.8:
            inputs[start:end] = mask_id
        elif a < 0.9:
            replaced.append((start, end))
    if replaced:  # one draw for all: the same ids as a draw per group, in group order
        ids = random_non_special(rng, sum(end - start for start, end in replaced), vocab_size, special_ids)
        taken = 0
        for start, end in replaced:
            inputs[start:end] = ids[taken:taken + end - start]
            taken += end - start
    return inputs


class Masked(NamedTuple):
    """One row's masking: what `mlm_batch` lays into the batch."""
    tokens: np.ndarray  # the row
    inputs: np.ndarray  # the row corrupted
    positions: np.ndarray  # the masked positions, ascending
    len_a: int  # length of the [CLS] A [SEP] part (segment 0)
    span_starts: np.ndarray | None = None  # SpanBERT: each target's span, start..end
    span_ends: np.ndarray | None = None


def mlm_batch(rows: list[Masked], *, max_seq_length: int, max_predictions: int,
              pad_id: int) -> dict[str, np.ndarray]:
    """The padded fields of `masked_lm_fields` for a batch of masked rows (with SpanBERT's
    `pair_positions` and `span_offsets` when the rows carry spans)."""
    b = len(rows)
    input_ids = np.full((b, max_seq_length), pad_id, np.int32)
    original = np.zeros((b, max_seq_length), np.int32)
    masked_positions = np.zeros((b, max_predictions), np.int32)
    lengths = np.array([len(r.tokens) for r in rows], np.int64)
    counts = np.array([len(r.positions) for r in rows], np.int64)
    for k, row in enumerate(rows):
        input_ids[k, :lengths[k]] = row.inputs
        original[k, :lengths[k]] = row.tokens
        masked_positions[k, :counts[k]] = row.positions
    columns = np.arange(max_seq_length)
    len_a = np.array([r.len_a for r in rows], np.int64)
    masked_weights = np.arange(max_predictions) < counts[:, None]
    out = {"input_ids": input_ids,
           "segment_ids": ((columns >= len_a[:, None]) & (columns < lengths[:, None])).astype(np.int32),
           "input_mask": (columns < lengths[:, None]).astype(np.int32),
           "masked_positions": masked_positions,
           "masked_labels": np.where(masked_weights, np.take_along_axis(original, masked_positions, 1), 0).astype(np.int32),
           "masked_weights": masked_weights.astype(np.float32)}
    if b and rows[0].span_starts is not None:
        pairs = np.zeros((b, max_predictions, 2), np.int32)
        offsets = np.zeros((b, max_predictions), np.int32)
        for k, row in enumerate(rows):
            pairs[k, :counts[k], 0] = row.span_starts - 1
            pairs[k, :counts[k], 1] = row.span_ends
            offsets[k, :counts[k]] = row.positions - row.span_starts
        out |= {"pair_positions": pairs, "span_offsets": offsets}
    return out


def first_row(batch: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    return {name: value[0] for name, value in batch.items()}


def _check_length(n: int, max_seq_length: int) -> None:
    if n > max_seq_length:
        raise ValueError(f"example has {n} tokens, more than max_seq_length={max_seq_length}")


def whole_words(tokens: np.ndarray, word_starts: np.ndarray, rng: np.random.Generator, *,
                vocab_size: int, mask_id: int, special_ids: Iterable[int], max_seq_length: int,
                max_predictions: int, mask_prob: float = 0.15, len_a: int | None = None) -> Masked:
    """BERT's whole-word masking of one row: words in random order, each taken whole while it fits in
    the budget of ~mask_prob of the non-special tokens; one 80/10/10 action per word.

    `len_a` is the length of the [CLS] A [SEP] part (segment 0); None: one segment."""
    tokens = np.asarray(tokens, np.int32)
    _check_length(len(tokens), max_seq_length)
    special_ids = tuple(special_ids)
    candidates = candidate_mask(tokens, special_ids, vocab_size)
    budget = prediction_budget(int(candidates.sum()), mask_prob, max_predictions)
    starts, ends = word_bounds(word_starts, candidates)
    chosen, total = [], 0
    for w in rng.permutation(len(starts)):
        size = ends[w] - starts[w]
        if total + size <= budget:
            chosen.append((int(starts[w]), int(ends[w])))
            total += size
        if total >= budget:
            break
    inputs = apply_actions(tokens, chosen, rng, vocab_size=vocab_size, mask_id=mask_id, special_ids=special_ids)
    positions = np.sort(np.concatenate([np.arange(a, b) for a, b in chosen])) if chosen else np.zeros(0, np.int64)
    return Masked(tokens, inputs, positions, len(tokens) if len_a is None else len_a)


def mask_words(tokens: np.ndarray, word_starts: np.ndarray, rng: np.random.Generator, *,
               max_seq_length: int, max_predictions: int, pad_id: int = 0, **settings) -> dict[str, np.ndarray]:
    """`whole_words` of one row as its padded fields."""
    masked = whole_words(tokens, word_starts, rng, max_seq_length=max_seq_length, max_predictions=max_predictions,
                         **settings)
    return first_row(mlm_batch([masked], max_seq_length=max_seq_length, max_predictions=max_predictions,
                               pad_id=pad_id))


def clipped_geometric(p: float = 0.2, max_span: int = 10) -> np.ndarray:
    """SpanBERT's span-length pmf over 1..max_span: Geometric(p) renormalised on that range, as
    facebookresearch/SpanBERT samples it (`np.random.choice(lens, p=len_distrib)` in
    pretraining/fairseq/data/masking.py), not the geometric with its tail piled on max_span."""
    pmf = p * (1 - p) ** np.arange(max_span)
    return pmf / pmf.sum()


class Spans(NamedTuple):
    starts: np.ndarray  # first token of each span, in the order drawn
    ends: np.ndarray  # one past its last token
    drawn: np.ndarray  # span length in words as drawn; only the last span may be shorter


def _most_words(starts: np.ndarray, ends: np.ndarray, masked: np.ndarray, left: int) -> np.ndarray:
    """For every word w, the most words a span starting at w may take (0: none)."""
    n, num_words = len(masked) - 1, len(starts)
    index = np.arange(num_words)
    usable = (starts > 0) & ~(masked[starts] | masked[starts - 1])  # masked[-1] is masked[n]: False
    # a run: consecutive usable words, each ending where the next starts
    chained = np.zeros(num_words, bool)
    chained[:-1] = usable[:-1] & usable[1:] & (ends[:-1] == starts[1:])
    breaks = np.flatnonzero(~chained)
    run_last = breaks[np.searchsorted(breaks, index)]  # the run's last word
    # all of its run when the token after the run is free (inside a run the next word's start
    # always is), and no more tokens than the budget left
    run_end = ends[run_last]
    most = np.minimum(run_last + 1 - index - ((run_end >= n) | masked[run_end]),
                      np.searchsorted(ends, starts + left, side="right") - index)
    return np.where(usable, most, 0)


def _fits(w: int, k: int, starts: list[int], ends: list[int], masked: bytearray, left: int) -> bool:
    """Whether k words from word w make a span (scalar twin of `_most_words(...)[w] >= k`)."""
    if w + k > len(starts):
        return False
    s = starts[w]
    if s == 0 or masked[s] or masked[s - 1]:
        return False
    for j in range(w + 1, w + k):
        if ends[j - 1] != starts[j] or masked[starts[j]] or masked[starts[j] - 1]:
            return False
    e = ends[w + k - 1]
    return e < len(masked) - 1 and not masked[e] and e - s <= left


@functools.lru_cache(maxsize=16)
def _length_cdf(p: float, max_span: int) -> list[float]:
    cdf = np.cumsum(clipped_geometric(p, max_span))
    return (cdf / cdf[-1]).tolist()


def _draw_spans(starts: np.ndarray, ends: np.ndarray, length: int, rng: np.random.Generator, *, budget: int,
                p: float, max_span: int, tries: int = 16) -> list[tuple[int, int, int]]:
    """`sample_spans`' spans as (start, end, drawn) in the order drawn, from the `word_bounds` of a row of
    `length` tokens."""
    starts_list, ends_list = starts.tolist(), ends.tolist()
    num_words = len(starts_list)
    flags = bytearray(length + 1)  # flags[n] stays 0: the right edge is checked separately
    spans: list[tuple[int, int, int]] = []
    left = budget
    cdf = _length_cdf(p, max_span)
    uniform = rng.random
    while left > 0 and num_words:
        length = bisect.bisect_right(cdf, uniform()) + 1  # = rng.choice(max_span, p=pmf) + 1
        best, w = length, None
        for _ in range(tries if length <= left else 0):
            candidate = min(int(uniform() * num_words), num_words - 1)
            if _fits(candidate, length, starts_list, ends_list, flags, left):
                w = candidate
                break
        if w is None:
            most = _most_words(starts, ends, np.frombuffer(flags, bool), left)
            best = min(length, int(most.max()))
            if best <= 0:
                break
            fits = np.flatnonzero(most >= best)
            w = int(fits[min(int(uniform() * len(fits)), len(fits) - 1)])
        s, e = starts_list[w], ends_list[w + best - 1]
        flags[s:e] = b"\x01" * (e - s)
        spans.append((s, e, length))
        left -= e - s
        if best < length:
            break
    return spans


def sample_spans(word_starts: np.ndarray, candidates: np.ndarray, rng: np.random.Generator, *,
                 budget: int, p: float = 0.2, max_span: int = 10, tries: int = 16) -> Spans:
    """Disjoint spans of whole words, lengths drawn i.i.d. from `clipped_geometric(p, max_span)`.

    Each span starts at a word chosen uniformly among those where the drawn number of words fits:
    inside the sequence, adjacent words only, no special token, an unmasked token on either side
    (SBO's boundary pair) and no more tokens than the budget left. When it fits nowhere, the span
    takes the most words that fit somewhere and sampling stops, so the budget is never exceeded.

    The start is found by rejection (uniform words until one fits: uniform over those that fit),
    and after `tries` misses from the exact set of fitting words, which also settles "nowhere"."""
    spans = _draw_spans(*word_bounds(word_starts, candidates), len(candidates), rng, budget=budget, p=p,
                        max_span=max_span, tries=tries)
    return Spans(*np.array(spans, np.int64).reshape(-1, 3).T)


def spans_masked(tokens: np.ndarray, word_starts: np.ndarray, rng: np.random.Generator, *,
                 vocab_size: int, mask_id: int, special_ids: Iterable[int], max_seq_length: int,
                 max_predictions: int, mask_prob: float = 0.15, p: float = 0.2, max_span: int = 10) -> Masked:
    """SpanBERT masking of one row: whole-word spans (lengths from `clipped_geometric`) until
    ~mask_prob of the non-special tokens, one 80/10/10 action per span, and for every target its
    span (whose boundary tokens SBO reads)."""
    tokens = np.asarray(tokens, np.int32)
    _check_length(len(tokens), max_seq_length)
    candidates = candidate_mask(tokens, tuple(special_ids), vocab_size)
    return _spans_masked(tokens, word_bounds(word_starts, candidates), np.count_nonzero(candidates), rng,
                         vocab_size=vocab_size, mask_id=mask_id, special_ids=special_ids,
                         max_predictions=max_predictions, mask_prob=mask_prob, p=p, max_span=max_span)


def rows_spans_masked(tokens: np.ndarray, lengths: np.ndarray, word_starts: np.ndarray,
                      rngs: list[np.random.Generator], *, vocab_size: int, special_ids: Iterable[int],
                      max_seq_length: int, **settings) -> list[Masked]:
    """`spans_masked` of each row of a batch (row i with rngs[i] alone), their words found all at once:
    `tokens` and `word_starts` are [rows, width > every length], row i's first lengths[i] entries its own."""
    _check_length(lengths.max(initial=0), max_seq_length)
    real = np.arange(tokens.shape[1]) < lengths[:, None]
    candidates = non_special(vocab_size, tuple(special_ids))[tokens] & real
    counts = np.count_nonzero(candidates, axis=1).tolist()
    return [_spans_masked(tokens[i, :n], bounds, count, rng, vocab_size=vocab_size, special_ids=special_ids,
                          **settings)
            for i, (n, bounds, count, rng) in enumerate(zip(lengths.tolist(), rows_word_bounds(word_starts, candidates),
                                                            counts, rngs))]


def _spans_masked(tokens: np.ndarray, bounds: tuple[np.ndarray, np.ndarray], num_candidates: int,
                  rng: np.random.Generator, *, vocab_size: int, mask_id: int, special_ids: Iterable[int],
                  max_predictions: int, mask_prob: float = 0.15, p: float = 0.2, max_span: int = 10) -> Masked:
    """`spans_masked` of a row whose word bounds and candidate count are known."""
    budget = prediction_budget(num_candidates, mask_prob, max_predictions)
    spans = _draw_spans(*bounds, len(tokens), rng, budget=budget, p=p, max_span=max_span)
    inputs = apply_actions(tokens, [(s, e) for s, e, _ in spans], rng, vocab_size=vocab_size, mask_id=mask_id,
                           special_ids=special_ids)
    # the spans are disjoint: their tokens in position order are the spans in start order, expanded
    by_start = sorted(spans)
    positions = [t for s, e, _ in by_start for t in range(s, e)]
    span_start = [s for s, e, _ in by_start for _ in range(e - s)]
    span_end = [e for s, e, _ in by_start for _ in range(e - s)]
    return Masked(tokens, inputs, np.array(positions, np.int64), len(tokens), np.array(span_start, np.int64),
                  np.array(span_end, np.int64))


def span_mask(tokens: np.ndarray, word_starts: np.ndarray, rng: np.random.Generator, *,
              max_seq_length: int, max_predictions: int, pad_id: int = 0, **settings) -> dict[str, np.ndarray]:
    """`spans_masked` of one row as its padded fields, with `pair_positions` (the span's boundary
    tokens) and `span_offsets` (each target's 0-based place in its span)."""
    masked = spans_masked(tokens, word_starts, rng, max_seq_length=max_seq_length, max_predictions=max_predictions,
                          **settings)
    return first_row(mlm_batch([masked], max_seq_length=max_seq_length, max_predictions=max_predictions,
                               pad_id=pad_id))
