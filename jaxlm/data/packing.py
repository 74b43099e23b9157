"""Rows from documents: RoBERTa full-sentence rows, ALBERT sentence-order pairs, causal-LM packing."""
from __future__ import annotations

from typing import Iterable, Iterator, Sequence

import numpy as np

Document = Sequence[Sequence[int]]


def sentence_rows(documents: Iterable[Document], capacity: int, *, sep_id: int | None,
                  cross_documents: bool = True) -> Iterator[tuple[np.ndarray, np.ndarray]]:
    """Whole sentences laid contiguously into rows of at most `capacity` tokens: (tokens, the
    position where each sentence starts), yielded as they fill. Across documents a `sep_id` token
    separates them (None: no separator); without `cross_documents` every document starts a new row.
    A sentence longer than a row is cut into row-sized pieces, so every token lands in exactly one row."""
    if capacity < 1:
        raise ValueError(f"rows must hold at least one token, got capacity {capacity}")
    row: list[int] = []
    starts: list[int] = []

    def flush():
        filled = (np.array(row, np.int32), np.array(starts, np.int32))
        row.clear()
        starts.clear()
        return filled

    for d, document in enumerate(d for d in documents if any(len(s) for s in d)):
        if d and not cross_documents and row:
            yield flush()
        for j, sentence in enumerate(s for s in document if len(s)):
            lead = [sep_id] if d and not j and row and sep_id is not None else []
            if len(row) + len(lead) + len(sentence) > capacity:
                if row:
                    yield flush()
                lead = []
            row.extend(lead)
            for i in range(0, len(sentence), capacity):
                if i and row:
                    yield flush()
                starts.append(len(row))
                row.extend(sentence[i:i + capacity])
    if row:
        yield flush()


def pack_sentences(documents: Sequence[Document], max_seq_length: int, *, cls_id: int,
                   sep_id: int) -> list[np.ndarray]:
    """RoBERTa's FULL-SENTENCES rows: [CLS] then whole sentences, contiguously and across document
    boundaries (an extra [SEP] between documents), as many as fit, then [SEP].

    The rows are then masked dynamically (`masking.mask_example` with len_a = the row's length)."""
    if max_seq_length < 3:
        raise ValueError(f"max_seq_length must be at least 3 ([CLS] x [SEP]), got {max_seq_length}")
    return [np.r_[cls_id, tokens, sep_id].astype(np.int32)
            for tokens, _ in sentence_rows(documents, max_seq_length - 2, sep_id=sep_id)]


def sentence_order_pair(segment_a: Sequence[int], segment_b: Sequence[int], rng: np.random.Generator,
                        *, cls_id: int, sep_id: int) -> tuple[np.ndarray, int, int]:
    """ALBERT's SOP example from two consecutive segments of one document: (tokens
    [CLS] X [SEP] Y [SEP], len_a = len([CLS] X [SEP]), label); label 1 (swapped) half the time."""
    swapped = int(rng.random() < 0.5)
    first, second = (segment_b, segment_a) if swapped else (segment_a, segment_b)
    tokens = np.array([cls_id, *first, sep_id, *second, sep_id], np.int32)
    return tokens, len(first) + 2, swapped


def causal_rows(docs: Iterable[Sequence[int]], max_seq_length: int, eos_id: int, *,
                packed: bool = True) -> Iterator[np.ndarray]:
    """Causal-LM rows before `causal_batch`, yielded as they fill: every document followed by EOS;
    packed, the stream cut into rows of max_seq_length tokens plus the next one (the last position's
    target); unpacked, one document per row, truncated to max_seq_length + 1."""
    sequences = (np.r_[np.asarray(d, np.int64), eos_id].astype(np.int32) for d in docs)
    if not packed:
        yield from (s[:max_seq_length + 1] for s in sequences)
        return
    yield from stream_chunks(sequences, max_seq_length + 1, max_seq_length)


def stream_chunks(pieces: Iterable[np.ndarray], size: int, step: int) -> Iterator[np.ndarray]:
    """The concatenation of `pieces` cut into windows of `size` tokens starting every `step` tokens
    (the last ones shorter), without holding more than a window and a piece."""
    buffer = np.zeros(0, np.int32)
    for piece in pieces:
        buffer = np.concatenate([buffer, piece])
        while len(buffer) > size:
            yield buffer[:size]
            buffer = buffer[step:]
    while len(buffer):
        yield buffer[:size]
        buffer = buffer[step:]


def causal_batch(rows: Sequence[np.ndarray], max_seq_length: int, eos_id: int) -> dict[str, np.ndarray]:
    """Rows of `causal_rows` as `CausalLmObjective` fields [rows, max_seq_length]: `segment_ids` number the
    documents in a row 1..k (a document's EOS belongs to it; 0 on padding); `targets` are the next tokens; the
    EOS closing a document, the row's lookahead token and padding get weight 0."""
    stream = np.zeros((len(rows), max_seq_length + 1), np.int32)  # each row and its lookahead, zero-padded
    lengths = np.empty(len(rows), np.int64)
    for i, row in enumerate(rows):
        row = row[:max_seq_length + 1]
        stream[i, :len(row)] = row
        lengths[i] = min(len(row), max_seq_length)
    tokens, next_tokens = stream[:, :-1], stream[:, 1:]
    real = np.arange(max_seq_length) < lengths[:, None]
    is_eos = (tokens == eos_id) & real
    segments = np.cumsum(is_eos, axis=1, dtype=np.int32) - is_eos + 1
    return {"input_ids": tokens.copy(), "segment_ids": np.where(real, segments, 0).astype(np.int32),
            "targets": np.where(is_eos | ~real, 0, next_tokens).astype(np.int32),
            "target_weights": (real & ~is_eos).astype(np.float32)}


def pack_documents(docs: Sequence[Sequence[int]], max_seq_length: int, eos_id: int, *,
                   packed: bool = True) -> dict[str, np.ndarray]:
    """Causal-LM rows [rows, max_seq_length] (`causal_rows` then `causal_batch`)."""
    return causal_batch(list(causal_rows(docs, max_seq_length, eos_id, packed=packed)), max_seq_length, eos_id)
