"""Tokenized documents on disk: each piece's files written as its documents are tokenized (complete
only once renamed), the whole corpus read back by document index (offsets in memory, tokens read on
demand), and rows spilled to a file in creation order to be read back in any order."""
from __future__ import annotations

import array
import itertools
import os
from pathlib import Path
from typing import Callable, Iterable, Sequence

import numpy as np

from jaxlm.data.layouts import Row, encode_row
from jaxlm.data.pieces import Piece

TOKENIZE_BATCH = 4096  # sentences per encode_batch call
PARTS = ("ids", "sentences", "documents")  # the documents file is renamed last: it marks a complete piece


class TokenizationFailed(RuntimeError):
    """The tokenization of the pieces failed for a reason other than bad input (a worker died)."""


def piece_path(work: Path, piece: Piece) -> Path:
    return work / f"piece-{piece.source:03d}-{piece.index:05d}"


def piece_done(work: Path, piece: Piece) -> bool:
    return piece_path(work, piece).with_suffix(".documents").is_file()


def sentence_space(tokenizer) -> str:
    """What goes before each sentence of a document but its first: a byte-level BPE keeps the space before a word
    in its first piece, so those sentences are the text's with the space that separated them (GPT-2 reads " The",
    not "The", after a full stop); nothing for the others, whose pieces carry no space."""
    return " " if tokenizer.word_marker == "Ġ" else ""


def tokenize_piece(documents: Iterable[Sequence[str]], tokenizer, target: Path,
                   check: Callable[[], None] = lambda: None) -> int:
    """Tokenizes `documents` batch by batch into target.ids (int32 tokens), target.sentences (tokens per
    sentence) and target.documents (sentences per document); returns the number of documents."""
    tmp = {part: target.with_suffix(f".{part}.tmp") for part in PARTS}
    files = {part: open(path, "wb") for part, path in tmp.items()}
    n_documents = 0
    batch: list[Sequence[str]] = []

    space = sentence_space(tokenizer)

    def flush():
        sentences = [space + s if k else s for doc in batch for k, s in enumerate(doc)]
        ids = tokenizer.encode_batch(sentences) if sentences else []
        lengths = np.fromiter(map(len, ids), np.int32, len(ids))
        np.fromiter((t for s in ids for t in s), "<i4", int(lengths.sum())).tofile(files["ids"])
        lengths.astype("<i4").tofile(files["sentences"])
        np.fromiter(map(len, batch), "<i4", len(batch)).tofile(files["documents"])
        batch.clear()
        check()

    try:
        queued = 0
        for document in documents:
            batch.append(document)
            n_documents += 1
            queued += len(document)
            if queued >= TOKENIZE_BATCH:
                flush()
                queued = 0
        flush()
    finally:
        for f in files.values():
            f.close()
    for part in PARTS:
        os.replace(tmp[part], target.with_suffix(f".{part}"))
    return n_documents


class TokenizedCorpus:
    """Every piece's documents in corpus order, by index: a document is its non-empty sentences."""

    def __init__(self, work: Path, pieces: Sequence[Piece]):
        self._paths = [piece_path(work, p).with_suffix(".ids") for p in pieces]
        self._sentence_paths = [p.with_suffix(".sentences") for p in self._paths]
        per_piece = []
        for path in self._paths:
            counts = np.fromfile(path.with_suffix(".documents"), "<i4").astype(np.int64)
            lengths = np.fromfile(path.with_suffix(".sentences"), "<i4").astype(np.int64)
            sentence_bounds = np.r_[0, np.cumsum(counts)]
            token_bounds = np.r_[0, np.cumsum(lengths)][sentence_bounds]
            per_piece.append((counts, sentence_bounds[:-1], token_bounds[:-1], np.diff(token_bounds)))
        self.piece_documents = np.array([len(c) for c, *_ in per_piece], np.int64)
        self._piece = np.repeat(np.arange(len(pieces), dtype=np.int32), self.piece_documents)
        join = lambda k: np.concatenate([p[k] for p in per_piece]) if per_piece else np.zeros(0, np.int64)
        self._sentences, self._sentence_start, self._token_start, self.n_tokens = map(join, range(4))
        self._fds: dict[tuple[int, int], int] = {}

    def __len__(self) -> int:
        return len(self._piece)

    def _read(self, which: int, piece: int, start: int, count: int) -> np.ndarray:
        key = (which, piece)
        if key not in self._fds:
            self._fds[key] = os.open((self._paths, self._sentence_paths)[which][piece], os.O_RDONLY)
        return np.frombuffer(os.pread(self._fds[key], 4 * count, 4 * start), "<i4")

    def document(self, index: int) -> "StoredDocument":
        piece = int(self._piece[index])
        lengths = self._read(1, piece, int(self._sentence_start[index]), int(self._sentences[index]))
        return StoredDocument(self, piece, int(self._token_start[index]), lengths[lengths > 0])

    def close(self) -> None:
        for fd in self._fds.values():
            os.close(fd)
        self._fds.clear()


class StoredDocument(Sequence):
    """A document's non-empty sentences (token lists), read from its piece when indexed or iterated; `tokens`
    reads a range of sentences as one array, `bounds` says where each sentence starts."""

    def __init__(self, corpus: TokenizedCorpus, piece: int, token_start: int, lengths: np.ndarray):
        self._corpus, self._piece, self._start = corpus, piece, token_start
        self.bounds = [0, *itertools.accumulate(lengths.tolist())]

    def __len__(self) -> int:
        return len(self.bounds) - 1

    def tokens(self, first: int, stop: int) -> np.ndarray:
        """The tokens of sentences first..stop-1, in one int32 array."""
        start = self.bounds[first]
        return self._corpus._read(0, self._piece, self._start + start, self.bounds[stop] - start)

    def _sentences(self, a: int, b: int) -> list[list[int]]:
        tokens, first = self.tokens(a, b).tolist(), self.bounds[a]
        return [tokens[x - first:y - first] for x, y in zip(self.bounds[a:b], self.bounds[a + 1:b + 1])]

    def __getitem__(self, k: int) -> list[int]:
        if not -len(self) <= k < len(self):
            raise IndexError(k)
        k %= len(self)
        return self._sentences(k, k + 1)[0]

    def __iter__(self):
        return iter(self._sentences(0, len(self)))


class Documents(Sequence):
    """The non-empty documents among `ids` of a corpus, read when indexed (the split a layout sees)."""

    def __init__(self, corpus: TokenizedCorpus, ids: np.ndarray):
        self._corpus = corpus
        self._ids = np.asarray(ids)[corpus.n_tokens[np.asarray(ids, np.int64)] > 0]

    def __len__(self) -> int:
        return len(self._ids)

    def __getitem__(self, k: int) -> StoredDocument:
        return self._corpus.document(int(self._ids[k]))


class RowSpill:
    """Rows appended to a file in creation order, read back (encoded in `dtype`) in any order."""

    def __init__(self, path: Path, dtype: str):
        self._file = open(path, "w+b")
        self._dtype = dtype
        self._offsets = array.array("q", [0])
        self.tokens = 0
        self.labels = 0

    def append(self, row: Row) -> None:
        record = encode_row(row, self._dtype)
        self._file.write(record)
        self._offsets.append(self._offsets[-1] + len(record))
        self.tokens += len(row.tokens)
        self.labels += row.label

    def __len__(self) -> int:
        return len(self._offsets) - 1

    def record(self, i: int) -> bytes:
        return os.pread(self._file.fileno(), self._offsets[i + 1] - self._offsets[i], self._offsets[i])

    def seal(self) -> None:
        """Every appended row readable by `record`."""
        self._file.flush()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self._file.close()
