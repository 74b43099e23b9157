"""BERT sentence-pair instances for MLM+NSP, built from documents of tokenized sentences."""
from __future__ import annotations

from typing import Iterator, NamedTuple, Sequence

import numpy as np

Document = Sequence[Sequence[int]]


class Instance(NamedTuple):
    tokens: np.ndarray  # int32 [CLS] A [SEP] B [SEP]
    len_a: int  # length of the [CLS] A [SEP] part
    is_random_next: int  # 1 if B was drawn from another document


def truncate_pair(a: list[int], b: list[int], max_num_tokens: int, rng: np.random.Generator) -> None:
    """Shortens the longer of a and b, one token at a time from a random end, until both fit (one
    uniform draw per token removed, drawn at once; the cuts made once at the end)."""
    excess = len(a) + len(b) - max_num_tokens
    if excess <= 0:
        return
    cuts = {id(a): [0, 0], id(b): [0, 0]}  # tokens off the front, off the back
    left = {id(a): len(a), id(b): len(b)}
    for from_front in (rng.random(excess) < 0.5).tolist():
        longer = id(a) if left[id(a)] > left[id(b)] else id(b)
        left[longer] -= 1
        cuts[longer][0 if from_front else 1] += 1
    for side in (a, b):
        front, back = cuts[id(side)]
        del side[len(side) - back:]
        del side[:front]


def _random_segments(documents: Sequence[Document], exclude: int, target: int,
                     rng: np.random.Generator) -> list[int]:
    n = len(documents)
    other = int(rng.integers(n - 1)) if n > 1 else 0
    if n > 1 and other >= exclude:
        other += 1
    doc = documents[other]
    out: list[int] = []
    for k in range(int(rng.integers(len(doc))), len(doc)):  # by index: a stored document reads only these
        out.extend(doc[k])
        if len(out) >= target:
            break
    return out


def instances_from_document(documents: Sequence[Document], index: int, max_seq_length: int,
                            short_seq_prob: float, rng: np.random.Generator,
                            cls_id: int, sep_id: int, random_next_prob: float = 0.5) -> list[Instance]:
    """BERT's create_instances_from_document: pairs (A, B) from document `index` of `documents`.

    One departure keeps NSP at 50%: where BERT forces a random B because the chunk holds a single
    sentence, a true-continuation draw pairs it with the next sentence (or, at the document's end,
    the previous one); only one-sentence documents still always get a random B.
    With `random_next_prob=0` (ALBERT's sentence-order pairs) B always continues A, and
    one-sentence documents give no pairs.
    """
    document = list(documents[index])
    max_num_tokens = max_seq_length - 3
    target = max_num_tokens
    if rng.random() < short_seq_prob:
        target = int(rng.integers(2, max_num_tokens + 1))
    instances: list[Instance] = []
    chunk: list[Sequence[int]] = []
    chunk_len = 0
    i = 0
    while i < len(document):
        chunk.append(document[i])
        chunk_len += len(document[i])
        if i == len(document) - 1 or chunk_len >= target:
            is_random = rng.random() < random_next_prob
            if len(chunk) == 1 and not is_random:
                if i + 1 < len(document):
                    i += 1
                    chunk.append(document[i])
                elif i > 0:
                    chunk.insert(0, document[i - 1])
                elif random_next_prob == 0:
                    return instances
                else:
                    is_random = True
            a_end = int(rng.integers(1, len(chunk))) if len(chunk) >= 2 else 1
            a = [t for seg in chunk[:a_end] for t in seg]
            if is_random:
                b = _random_segments(documents, index, target - len(a), rng)
                i -= len(chunk) - a_end
            else:
                b = [t for seg in chunk[a_end:] for t in seg]
            truncate_pair(a, b, max_num_tokens, rng)
            tokens = np.array([cls_id, *a, sep_id, *b, sep_id], dtype=np.int32)
            instances.append(Instance(tokens, len(a) + 2, int(is_random)))
            chunk, chunk_len = [], 0
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
