"""BERT sentence-pair instances for MLM+NSP, built from documents of tokenized sentences."""
from __future__ import annotations

import bisect
import itertools
from typing import Callable, Iterator, NamedTuple, Sequence

import numpy as np

Document = Sequence[Sequence[int]]


class Instance(NamedTuple):
    tokens: np.ndarray  # int32 [CLS] A [SEP] B [SEP]
    len_a: int  # length of the [CLS] A [SEP] part
    is_random_next: int  # 1 if B was drawn from another document


def truncation(len_a: int, len_b: int, max_num_tokens: int, rng: np.random.Generator) -> tuple[int, ...]:
    """(off a's front, off a's back, off b's front, off b's back): the longer of a and b shortened one token at
    a time from a random end until both fit (one uniform draw per token removed, drawn at once)."""
    excess = len_a + len_b - max_num_tokens
    if excess <= 0:
        return 0, 0, 0, 0
    from_front = rng.random(excess) < 0.5
    # the longer side loses the first `gap` tokens, until the two are equal; then b (the longer on a tie) and a
    # in turn, so a loses the (gap + 1)th, the (gap + 3)th, ...
    gap = min(abs(len_a - len_b), excess)
    a_first = len_a > len_b
    a_turns = from_front[gap + 1::2]
    a_removed = gap * a_first + len(a_turns)
    a_front = int(np.count_nonzero(from_front[:gap])) * a_first + int(np.count_nonzero(a_turns))
    b_front = int(np.count_nonzero(from_front)) - a_front
    return a_front, a_removed - a_front, b_front, excess - a_removed - b_front


def sentence_ranges(document: Document) -> tuple[list[int], Callable[[int, int], np.ndarray]]:
    """(where each sentence starts in the document's tokens, and where the last ends; a reader of the tokens of
    sentences first..stop-1 as one int32 array). A stored document (`tokenized.StoredDocument`) reads only
    those tokens from disk."""
    if hasattr(document, "tokens"):
        return document.bounds, document.tokens
    flat = np.fromiter(itertools.chain.from_iterable(document), np.int32)
    bounds = [0, *itertools.accumulate(len(s) for s in document)]
    return bounds, lambda first, stop: flat[bounds[first]:bounds[stop]]


def _random_segments(documents: Sequence[Document], exclude: int, target: int,
                     rng: np.random.Generator) -> np.ndarray:
    """Whole sentences of another document, from a random one on, until they reach `target` tokens or the
    document ends."""
    n = len(documents)
    other = int(rng.integers(n - 1)) if n > 1 else 0
    if n > 1 and other >= exclude:
        other += 1
    bounds, read = sentence_ranges(documents[other])
    first = int(rng.integers(len(bounds) - 1))
    stop = min(bisect.bisect_left(bounds, bounds[first] + target, lo=first + 1), len(bounds) - 1)
    return read(first, stop)


def instances_from_document(documents: Sequence[Document], index: int, max_seq_length: int,
                            short_seq_prob: float, rng: np.random.Generator,
                            cls_id: int, sep_id: int, random_next_prob: float = 0.5) -> list[Instance]:
    """BERT's create_instances_from_document: pairs (A, B) from document `index` of `documents`.

    One departure keeps NSP at 50%: where BERT forces a random B because the chunk holds a single
    sentence, a true-continuation draw pairs it with the next sentence (or, at the document's end,
    the previous one); only one-sentence documents still always get a random B.
    With `random_next_prob=0` (ALBERT's sentence-order pairs) B always continues A, and
    one-sentence documents give no pairs. A chunk is the sentences first..last, A its first `a_end`.
    """
    bounds, read = sentence_ranges(documents[index])
    n_sentences = len(bounds) - 1
    tokens = read(0, n_sentences)
    max_num_tokens = max_seq_length - 3
    target = max_num_tokens
    if rng.random() < short_seq_prob:
        target = int(rng.integers(2, max_num_tokens + 1))
    instances: list[Instance] = []
    first = i = 0
    while i < n_sentences:
        if i == n_sentences - 1 or bounds[i + 1] - bounds[first] >= target:
            last = i
            is_random = rng.random() < random_next_prob
            if first == last and not is_random:
                if i + 1 < n_sentences:
                    i = last = i + 1
                elif i > 0:
                    first = i - 1
                elif random_next_prob == 0:
                    return instances
                else:
                    is_random = True
            size = last - first + 1
            a_end = int(rng.integers(1, size)) if size >= 2 else 1
            a = tokens[bounds[first]:bounds[first + a_end]]
            if is_random:
                b = _random_segments(documents, index, target - len(a), rng)
                i -= size - a_end
            else:
                b = tokens[bounds[first + a_end]:bounds[last + 1]]
            a_front, a_back, b_front, b_back = truncation(len(a), len(b), max_num_tokens, rng)
            a, b = a[a_front:len(a) - a_back], b[b_front:len(b) - b_back]
            instances.append(Instance(np.concatenate([[cls_id], a, [sep_id], b, [sep_id]], dtype=np.int32),
                                      len(a) + 2, int(is_random)))
            first = i + 1
        i += 1
    return instances


def create_instances(documents: Sequence[Document], max_seq_length: int, rng: np.random.Generator,
                     *, cls_id: int, sep_id: int, short_seq_prob: float = 0.1,
                     dupe_factor: int = 1, random_next_prob: float = 0.5) -> Iterator[Instance]:
    """All instances of `dupe_factor` passes over `documents`, in creation order, as they are made.

    `documents` hold no empty document and no empty sentence (`non_empty`); random B segments come
    only from them, read by index.
    """
    if max_seq_length < 5:
        raise ValueError(f"max_seq_length must be at least 5 ([CLS] A [SEP] B [SEP]), got {max_seq_length}")
    for _ in range(dupe_factor):
        for index in range(len(documents)):
            yield from instances_from_document(documents, index, max_seq_length, short_seq_prob,
                                               rng, cls_id, sep_id, random_next_prob)


def non_empty(documents: Sequence[Document]) -> list[list[Sequence[int]]]:
    """The documents without their empty sentences, those left empty dropped."""
    docs = [[s for s in doc if len(s)] for doc in documents]
    return [d for d in docs if d]
