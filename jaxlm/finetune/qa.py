"""Extractive question answering's host side: [CLS] question [SEP] context-window [SEP] rows over a long
context in overlapping windows (Hugging Face's truncation="only_second" with `stride`), each token's
character span in the context, the answer's token positions, and n-best decoding back to characters."""
from __future__ import annotations

import dataclasses

import numpy as np

from jaxlm.data.tokenizers.roles import special_ids
from jaxlm.finetune.metrics import softmax


@dataclasses.dataclass
class Window:
    """One row: ids, segments and mask [max_length]; `offsets[t]` the (start, end) characters of token t
    in the context, None outside it; the answer's token positions (0, 0: not in this window)."""

    input_ids: np.ndarray
    segment_ids: np.ndarray
    input_mask: np.ndarray
    offsets: list
    start_position: int = 0
    end_position: int = 0

    def row(self) -> dict:
        return {"input_ids": self.input_ids, "segment_ids": self.segment_ids, "input_mask": self.input_mask,
                "start_position": np.int32(self.start_position), "end_position": np.int32(self.end_position),
                "answer_weight": np.float32(1)}


def window_starts(length: int, budget: int, stride: int) -> list[int]:
    """Where each window of `budget` tokens starts; consecutive windows share `stride` tokens (the last
    one ends at `length`), as the overflowing windows of Hugging Face's tokenizers do."""
    starts = [0]
    while starts[-1] + budget < length:
        starts.append(starts[-1] + budget - stride)
    return starts


def qa_windows(tokenizer, question: str, context: str, max_length: int, doc_stride: int,
               max_query_length: int = 64, answers: list[dict] | None = None) -> list[Window]:
    """The windows of one question; with `answers`, the first one's token positions in each window
    that holds it whole ([CLS], 0, in the others: Hugging Face's run_qa.py trains on those too)."""
    special = special_ids(tokenizer)
    cls, sep, pad = special["cls"], special["sep"], special["pad"] or 0
    query = tokenizer.encode(question)[:max_query_length]
    ids, offsets = tokenizer.encode_with_offsets(context)
    budget = max_length - len(query) - 3
    if budget <= doc_stride:
        raise ValueError(f"finetune.doc_stride={doc_stride} must be smaller than the context tokens a window holds "
                         f"({budget} = max_length {max_length} - question {len(query)} - 3 special tokens); lower "
                         "doc_stride or max_query_length, or raise max_length")
    first = len(query) + 2  # where the context starts in a row
    answer = None
    if answers:
        start_char = int(answers[0]["answer_start"])
        answer = (start_char, start_char + len(answers[0]["text"]))
    windows = []
    for start in window_starts(len(ids), budget, doc_stride):
        piece, spans = ids[start:start + budget], offsets[start:start + budget]
        row = [cls, *query, sep, *piece, sep]
        row_spans = [None] * first + list(spans) + [None] * (max_length - first - len(spans))
        window = Window(np.full(max_length, pad, np.int32), np.zeros(max_length, np.int32),
                        np.zeros(max_length, np.int32), row_spans)
        window.input_ids[:len(row)], window.input_mask[:len(row)] = row, 1
        window.segment_ids[first:len(row)] = 1
        if answer is not None and spans and spans[0][0] <= answer[0] and spans[-1][1] >= answer[1]:
            window.start_position = first + max(i for i, (s, _) in enumerate(spans) if s <= answer[0])
            window.end_position = first + min(i for i, (_, e) in enumerate(spans) if e >= answer[1])
        windows.append(window)
    return windows


@dataclasses.dataclass(frozen=True)
class Answer:
    text: str
    start: int  # characters of the context: context[start:end] == text
    end: int
    score: float


def decode_answers(start_logits: np.ndarray, end_logits: np.ndarray, windows: list[Window], context: str,
                   n_best: int = 20, max_answer_length: int = 30) -> list[Answer]:
    """The n-best answers over a question's windows, best first (Hugging Face's postprocessing of
    run_qa.py): the top `n_best` starts and ends of each window, spans inside the context, end not
    before start, at most `max_answer_length` tokens, scored by start + end logit. Empty when no span
    qualifies."""
    candidates = []
    for starts, ends, window in zip(start_logits, end_logits, windows):
        offsets = window.offsets
        for s in np.argsort(starts)[::-1][:n_best]:
            for e in np.argsort(ends)[::-1][:n_best]:
                if s >= len(offsets) or e >= len(offsets) or offsets[s] is None or offsets[e] is None:
                    continue
                if e < s or e - s + 1 > max_answer_length:
                    continue
                begin, finish = offsets[s][0], offsets[e][1]
                candidates.append(Answer(context[begin:finish], int(begin), int(finish),
                                         float(starts[s] + ends[e])))
    candidates.sort(key=lambda a: -a.score)
    return candidates[:n_best]


def prediction_record(answers: list[Answer], shown: int = 5) -> dict:
    """`jaxlm predict`'s line: the best answer with its characters, and the first `shown` of the n-best
    with probabilities (a softmax over the n-best scores)."""
    if not answers:
        return {"answer": "", "start": 0, "end": 0, "n_best": []}
    probabilities = softmax([a.score for a in answers])
    best = answers[0]
    return {"answer": best.text, "start": best.start, "end": best.end,
            "n_best": [{"text": a.text, "start": a.start, "end": a.end, "probability": round(float(p), 6)}
                       for a, p in zip(answers[:shown], probabilities)]}


def first_token_answer(context: str) -> str:
    """The trivial baseline: the context's first word."""
    words = context.split()
    return words[0] if words else ""
