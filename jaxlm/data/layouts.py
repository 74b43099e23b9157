"""The rows `jaxlm prepare` stores for each objective (built once from tokenized documents) and
their byte encoding; the randomness each epoch adds lives in `examples.py`."""
from __future__ import annotations

import dataclasses
from typing import NamedTuple, Sequence

import numpy as np

from jaxlm.data.denoising import t5_input_target_lengths
from jaxlm.data.packing import causal_rows, sentence_rows
from jaxlm.data.pairs import create_instances

Document = Sequence[Sequence[int]]

# family -> how its rows are laid out
LAYOUTS = {"bert": "nsp_pairs", "albert": "sop_pairs", "roberta": "sentence_rows", "distilbert": "sentence_rows",
           "spanbert": "sentence_rows", "gpt2": "causal", "llama": "causal", "t5": "t5_chunks",
           "bart": "bart_rows"}
# roles (see tokenizers/roles.py) each layout's rows and examples need
REQUIRED_ROLES = {"nsp_pairs": ("cls", "sep", "mask", "pad"), "sop_pairs": ("cls", "sep", "mask", "pad"),
                  "sentence_rows": ("cls", "sep", "mask", "pad"), "causal": ("eos",),
                  "t5_chunks": ("eos",), "bart_rows": ("bos", "eos", "mask")}


class Row(NamedTuple):
    tokens: np.ndarray  # int32
    len_a: int = 0  # pairs: length of [CLS] A [SEP]
    label: int = 0  # pairs: 1 = B is a random sentence (NSP)
    sentence_starts: np.ndarray = np.zeros(0, np.int32)  # where each stored sentence starts


def encode_row(row: Row) -> bytes:
    """Little-endian int32 [label, len_a, len(tokens), *tokens, *sentence_starts]."""
    header = np.array([row.label, row.len_a, len(row.tokens)], "<i4")
    return b"".join(np.asarray(x, "<i4").tobytes() for x in (header, row.tokens, row.sentence_starts))


def decode_row(record: bytes) -> Row:
    values = np.frombuffer(record, "<i4").astype(np.int32)
    n = int(values[2])
    return Row(values[3:3 + n], int(values[1]), int(values[0]), values[3 + n:])


@dataclasses.dataclass(frozen=True)
class LayoutSettings:
    max_seq_length: int = 128
    short_seq_prob: float = 0.1
    dupe_factor: int = 1
    packed: bool = True  # causal rows: pack documents (False: one per row)
    noise_density: float = 0.15  # T5: sets how many raw tokens a row holds
    mean_span_length: float = 3.0


def check_roles(layout: str, special: dict, family: str) -> None:
    missing = [r for r in REQUIRED_ROLES[layout] if special.get(r) is None]
    if missing:
        raise ValueError(f"model.family={family} needs a tokenizer with {', '.join(missing)} token(s), and the "
                         f"configured one (data.vocab) has none; choose a tokenizer that has them")
    if layout == "t5_chunks" and not special.get("sentinels"):
        raise ValueError("T5 span corruption needs sentinel ids: use a SentencePiece data.vocab with data.sentinels > 0")


def t5_raw_length(settings: LayoutSettings) -> int:
    return t5_input_target_lengths(settings.max_seq_length, settings.noise_density, settings.mean_span_length)[0]


def build_rows(layout: str, documents: Sequence[Document], rng: np.random.Generator, settings: LayoutSettings,
               special: dict) -> list[Row]:
    """The stored rows of one split, in creation order (the caller shuffles)."""
    seq = settings.max_seq_length
    if layout in ("nsp_pairs", "sop_pairs"):
        instances = create_instances(documents, seq, rng, cls_id=special["cls"], sep_id=special["sep"],
                                     short_seq_prob=settings.short_seq_prob, dupe_factor=settings.dupe_factor,
                                     random_next_prob=0.5 if layout == "nsp_pairs" else 0.0)
        return [Row(x.tokens, x.len_a, x.is_random_next) for x in instances]
    if layout in ("sentence_rows", "bart_rows"):
        # BART frames rows with BOS/EOS and keeps documents apart; RoBERTa/SpanBERT: [CLS] ... [SEP]
        first, last = (special["bos"], special["eos"]) if layout == "bart_rows" else (special["cls"], special["sep"])
        rows = sentence_rows(documents, seq - 2, sep_id=None if layout == "bart_rows" else special["sep"],
                             cross_documents=layout == "sentence_rows")
        return [Row(np.r_[first, tokens, last].astype(np.int32), sentence_starts=starts + 1) for tokens, starts in rows]
    docs = [np.concatenate([np.asarray(s, np.int32) for s in doc]) for doc in documents if sum(map(len, doc))]
    if layout == "causal":
        return [Row(r) for r in causal_rows(docs, seq, special["eos"], packed=settings.packed)]
    if layout == "t5_chunks":
        # T5 concatenates the corpus and cuts raw chunks that span-corrupt to exactly max_seq_length
        stream = np.concatenate(docs)
        size = t5_raw_length(settings)
        return [Row(stream[i:i + size]) for i in range(0, len(stream), size) if len(stream[i:i + size]) >= 2]
    raise ValueError(f"unknown layout {layout!r}; known: {', '.join(sorted(set(LAYOUTS.values())))}")
