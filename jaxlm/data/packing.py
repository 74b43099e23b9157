"""Rows from documents: RoBERTa full-sentence rows, ALBERT sentence-order pairs, causal-LM packing."""
from __future__ import annotations

from typing import Sequence

import numpy as np

Document = Sequence[Sequence[int]]


def pack_sentences(documents: Sequence[Document], max_seq_length: int, *, cls_id: int,
                   sep_id: int) -> list[np.ndarray]:
    """RoBERTa's FULL-SENTENCES rows: [CLS] then whole sentences, contiguously and across document
    boundaries (an extra [SEP] between documents), as many as fit, then [SEP].

    A sentence longer than a row is cut into row-sized pieces, so every token lands in one row.
    The rows are then masked dynamically (`masking.mask_example` with len_a = the row's length)."""
    capacity = max_seq_length - 2
    if capacity < 1:
        raise ValueError(f"max_seq_length must be at least 3 ([CLS] x [SEP]), got {max_seq_length}")
    rows: list[np.ndarray] = []
    row: list[int] = []

    def flush():
        if row:
            rows.append(np.array([cls_id, *row, sep_id], np.int32))
            row.clear()

    for d, document in enumerate(d for d in documents if any(len(s) for s in d)):
        for j, sentence in enumerate(s for s in document if len(s)):
            lead = [sep_id] if d and not j and row else []
            if len(row) + len(lead) + len(sentence) > capacity:
                flush()
                lead = []
            row.extend(lead)
            for i in range(0, len(sentence), capacity):
                if i:
                    flush()
                row.extend(sentence[i:i + capacity])
    flush()
    return rows


def sentence_order_pair(segment_a: Sequence[int], segment_b: Sequence[int], rng: np.random.Generator,
                        *, cls_id: int, sep_id: int) -> tuple[np.ndarray, int, int]:
    """ALBERT's SOP example from two consecutive segments of one document: (tokens
    [CLS] X [SEP] Y [SEP], len_a = len([CLS] X [SEP]), label); label 1 (swapped) half the time."""
    swapped = int(rng.random() < 0.5)
    first, second = (segment_b, segment_a) if swapped else (segment_a, segment_b)
    tokens = np.array([cls_id, *first, sep_id, *second, sep_id], np.int32)
    return tokens, len(first) + 2, swapped


def _causal_row(tokens: np.ndarray, segments: np.ndarray, next_tokens: np.ndarray,
                weights: np.ndarray, max_seq_length: int) -> dict[str, np.ndarray]:
    n = len(tokens)
    pad = lambda x, dtype: np.pad(x, (0, max_seq_length - n)).astype(dtype)
    return {"input_ids": pad(tokens, np.int32), "segment_ids": pad(segments, np.int32),
            "targets": pad(next_tokens, np.int32), "target_weights": pad(weights, np.float32)}


def pack_documents(docs: Sequence[Sequence[int]], max_seq_length: int, eos_id: int, *,
                   packed: bool = True) -> dict[str, np.ndarray]:
    """Causal-LM rows [rows, max_seq_length]: every document followed by EOS.

    Packed: the documents are concatenated and cut into rows; `segment_ids` number the documents
    (or pieces of them) in each row 1..k, 0 on padding. Unpacked: one document per row, truncated.
    `targets` are the next token of the same document (a document's last token predicts EOS);
    Only the EOS closing a document and padding get weight 0."""
    if packed:
        stream = np.concatenate([np.r_[np.asarray(d, np.int64), eos_id] for d in docs]) if docs else np.zeros(0, np.int64)
        doc_index = np.concatenate([np.full(len(d) + 1, i) for i, d in enumerate(docs)]) if docs else stream
        is_eos = np.zeros(len(stream), bool)
        is_eos[np.cumsum([len(d) + 1 for d in docs]) - 1] = True
        next_tokens = np.r_[stream[1:], eos_id]
        rows = []
        for start in range(0, len(stream), max_seq_length):
            piece = slice(start, start + max_seq_length)
            owner = doc_index[piece]
            segments = np.cumsum(np.r_[True, owner[1:] != owner[:-1]])
            rows.append(_causal_row(stream[piece], segments, np.where(is_eos[piece], 0, next_tokens[piece]),
                                    (~is_eos[piece]).astype(np.float32), max_seq_length))
    else:
        rows = []
        for d in docs:
            sequence = np.r_[np.asarray(d, np.int64), eos_id]
            tokens = sequence[:max_seq_length]
            next_tokens = np.r_[sequence[1:], 0][:len(tokens)]
            weights = np.arange(len(tokens)) < len(sequence) - 1
            rows.append(_causal_row(tokens, np.ones(len(tokens)), next_tokens, weights, max_seq_length))
    if not rows:
        raise ValueError("pack_documents got no documents")
    return {k: np.stack([r[k] for r in rows]) for k in rows[0]}
