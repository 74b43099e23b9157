"""Span-based labelling's host side: the candidate spans of a sentence (whole words, up to L of them, from
a word's first subword to a word's last), their gold classes from BIO tags (entities as seqeval reads
them), and greedy decoding of non-overlapping spans back to BIO tags."""
from __future__ import annotations

import numpy as np
from seqeval.metrics.sequence_labeling import get_entities

from jaxlm.finetune.metrics import softmax

NONE = 0  # the "no entity" class; entity type i is class i + 1


def entity_types(tags: list[str]) -> list[str]:
    """The entity types of a BIO tag set (B-X, I-X -> X), sorted."""
    return sorted({tag.split("-", 1)[1] for tag in tags if "-" in tag})


def word_bounds(words_of_tokens: list[int | None]) -> dict[int, tuple[int, int]]:
    """word -> (its first token, its last token)."""
    bounds: dict[int, tuple[int, int]] = {}
    for position, word in enumerate(words_of_tokens):
        if word is not None:
            first = bounds.get(word, (position, position))[0]
            bounds[word] = (first, position)
    return bounds


def candidates(bounds: dict[int, tuple[int, int]], max_span_length: int) -> list[tuple[int, int]]:
    """(first word, last word) of every span of up to `max_span_length` consecutive words that kept a
    token (truncation drops the rest)."""
    words = sorted(bounds)
    return [(words[i], words[j]) for i in range(len(words))
            for j in range(i, min(i + max_span_length, len(words))) if words[j] - words[i] == j - i]


def span_arrays(bounds, spans: list[tuple[int, int]], gold: dict[tuple[int, int], int], size: int) -> dict:
    """span_starts, span_ends (tokens), span_labels and span_weights [size] of the candidate `spans`."""
    if len(spans) > size:
        raise ValueError(f"{len(spans)} candidate spans exceed the {size} a row holds")
    arrays = {"span_starts": np.zeros(size, np.int32), "span_ends": np.zeros(size, np.int32),
              "span_labels": np.zeros(size, np.int32), "span_weights": np.zeros(size, np.float32)}
    for index, (first, last) in enumerate(spans):
        arrays["span_starts"][index], arrays["span_ends"][index] = bounds[first][0], bounds[last][1]
        arrays["span_labels"][index] = gold.get((first, last), NONE)
        arrays["span_weights"][index] = 1
    return arrays


def gold_spans(tags: list[str], types: list[str]) -> dict[tuple[int, int], int]:
    """(first word, last word) -> class of each entity in BIO `tags` (seqeval's reading of them)."""
    return {(start, end): types.index(kind) + 1 for kind, start, end in get_entities(list(tags))}


def decode(logits: np.ndarray, spans: list[tuple[int, int]], types: list[str], num_words: int) -> list[str]:
    """BIO tags of the spans whose best class is an entity, taken by descending probability, each one
    skipped if it overlaps a span already taken."""
    probabilities = softmax(logits)
    chosen, taken = [], np.zeros(num_words, bool)
    order = np.argsort(-probabilities[:len(spans), 1:].max(-1))
    for index in order:
        kind = int(probabilities[index].argmax())
        first, last = spans[index]
        if kind != NONE and not taken[first:last + 1].any():
            taken[first:last + 1] = True
            chosen.append((first, last, types[kind - 1]))
    tags = ["O"] * num_words
    for first, last, kind in chosen:
        tags[first] = f"B-{kind}"
        for word in range(first + 1, last + 1):
            tags[word] = f"I-{kind}"
    return tags
