"""The rows `jaxlm prepare` stores for each objective (built once from tokenized documents) and
their byte encoding; the randomness each epoch adds lives in `examples.py`."""
from __future__ import annotations

from typing import Iterator, NamedTuple, Sequence

import numpy as np

from jaxlm.data.denoising import check_sentinels, t5_lengths
from jaxlm.data.packing import causal_rows, sentence_rows, stream_chunks
from jaxlm.data.pairs import create_instances
from jaxlm.data.settings import DataConfig
from jaxlm.data.tokenizers.roles import special_ids
from jaxlm.data.tokenizers.spm import SentencePieceTokenizer

Document = Sequence[Sequence[int]]
# how a family's rows are laid out (jaxlm.families names one per family)
LAYOUTS = ("nsp_pairs", "sop_pairs", "sentence_rows", "causal", "t5_chunks", "bart_rows")
PAIRED = ("nsp_pairs", "sop_pairs")  # the layouts whose rows hold two segments, told apart by token types 0 and 1
# layout -> the roles of the tokens before and after a text in its rows (T5's eos is added by span corruption)
FRAMES = {"nsp_pairs": ("cls", "sep"), "sop_pairs": ("cls", "sep"), "sentence_rows": ("cls", "sep"),
          "bart_rows": ("bos", "eos"), "t5_chunks": (None, "eos"), "causal": (None, None)}


def frame_ids(special: dict, layout: str) -> tuple[int | None, int | None]:
    """The ids put before and after a text in `layout`'s rows (FRAMES), from a tokenizer's `special_ids`."""
    return tuple(special[role] if role else None for role in FRAMES[layout])


def framed(tokenizer, layout: str):
    """`tokenizer`, where it is a bare SentencePiece model (which holds no template), made to frame a text with
    `add_special_tokens=True` as `layout` frames its rows, as its converted tokenizer.json does (T5: the
    text, then </s>); other tokenizers frame by their own template."""
    if isinstance(tokenizer, SentencePieceTokenizer):
        tokenizer.frame = frame_ids(special_ids(tokenizer), layout)
    return tokenizer


class Row(NamedTuple):
    tokens: np.ndarray  # int32
    len_a: int = 0  # pairs: length of [CLS] A [SEP]
    label: int = 0  # pairs: 1 = B is a random sentence (NSP)
    sentence_starts: np.ndarray = np.zeros(0, np.int32)  # where each stored sentence starts


RECORD_DTYPES = ("<u2", "<i4")  # what `record_dtype` chooses from


def record_dtype(vocab_size: int, max_seq_length: int) -> str:
    """The dtype a row's numbers are stored in: uint16 where every token id and position fits (half the bytes
    of int32 to store and read), int32 otherwise."""
    narrow, wide = RECORD_DTYPES
    return narrow if max(vocab_size, max_seq_length + 1) <= 2**16 else wide


def encode_row(row: Row, dtype: str = "<i4") -> bytes:
    """[label, len_a, len(tokens), *tokens, *sentence_starts] in `dtype` (`record_dtype`)."""
    header = np.array([row.label, row.len_a, len(row.tokens)], dtype)
    return b"".join(np.asarray(x, dtype).tobytes() for x in (header, row.tokens, row.sentence_starts))


def decode_row(record: bytes, dtype: str = "<i4") -> Row:
    values = np.frombuffer(record, dtype).astype(np.int32)
    n = int(values[2])
    return Row(values[3:3 + n], int(values[1]), int(values[0]), values[3 + n:])


def check_roles(roles: Sequence[str], special: dict, family: str, data: DataConfig) -> None:
    """ValueError naming each of `roles` (see tokenizers/roles.py) the tokenizer has no token for, or too few
    sentinels for the noise spans of `data`'s rows."""
    missing = [r for r in roles if r != "sentinels" and special.get(r) is None]
    if missing:
        raise ValueError(f"model.family={family} needs a tokenizer with {', '.join(missing)} token(s), and the "
                         f"configured one (data.vocab) has none; choose a tokenizer that has them")
    if "sentinels" in roles and not special.get("sentinels"):
        raise ValueError("T5 span corruption needs sentinel ids: use a SentencePiece data.vocab with data.sentinels > 0")
    if "sentinels" in roles:
        check_sentinels(data, len(special["sentinels"]))


def build_rows(layout: str, documents: Sequence[Document], rng: np.random.Generator, settings: DataConfig,
               special: dict) -> Iterator[Row]:
    """The stored rows of one split, in creation order (the caller shuffles), yielded as they are made
    from `documents` (no empty document or sentence: `pairs.non_empty`), read one at a time."""
    if layout not in LAYOUTS:
        raise ValueError(f"unknown layout {layout!r}; known: {', '.join(LAYOUTS)}")
    seq = settings.max_seq_length
    if layout in PAIRED:
        instances = create_instances(documents, seq, rng, cls_id=special["cls"], sep_id=special["sep"],
                                     short_seq_prob=settings.short_seq_prob, dupe_factor=settings.dupe_factor,
                                     random_next_prob=0.5 if layout == "nsp_pairs" else 0.0)
        return (Row(x.tokens, x.len_a, x.is_random_next) for x in instances)
    if layout in ("sentence_rows", "bart_rows"):
        # BART frames rows with BOS/EOS and keeps documents apart; RoBERTa/SpanBERT: [CLS] ... [SEP]
        first, last = (special[role] for role in FRAMES[layout])
        rows = sentence_rows(iter(documents), seq - 2, sep_id=None if layout == "bart_rows" else special["sep"],
                             cross_documents=layout == "sentence_rows")
        return (Row(np.r_[first, tokens, last].astype(np.int32), sentence_starts=starts + 1) for tokens, starts in rows)
    docs = (np.concatenate([np.asarray(s, np.int32) for s in doc]) for doc in documents)
    if layout == "causal":
        return (Row(r) for r in causal_rows(docs, seq, special["eos"], packed=settings.packed))
    # T5 concatenates the corpus and cuts raw chunks that span-corrupt to exactly max_seq_length
    size = t5_lengths(settings)[0]
    return (Row(chunk) for chunk in stream_chunks(docs, size, size) if len(chunk) >= 2)
