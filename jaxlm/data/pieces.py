"""A corpus cut into pieces that are tokenized apart (in order by one process, or by Beam workers):
byte ranges of text and JSONL files ending at a document boundary, example ranges of TFDS splits;
each piece's documents read lazily, with any line that is not UTF-8 named (fatal or skipped)."""
from __future__ import annotations

import json
import os
import pathlib
from typing import Callable, Iterator, NamedTuple

from jaxlm.corpora.text import (BOM, check_characters, line_documents, not_utf8, raw_lines, split_sentences,
                                text_lines, warn_on_stderr)
from jaxlm.data import tfds_source

PIECE_EXAMPLES = 20000
JSONL_SUFFIXES = (".jsonl", ".ndjson")


class Piece(NamedTuple):
    source: int  # position of the source in the corpus list
    index: int  # position of the piece in its source
    start: int  # byte offset (files) or example index (TFDS)
    stop: int
    first_line: int = 1  # line number at `start` (files)


def is_tfds(source) -> bool:
    return isinstance(source, str) and source.startswith("tfds:")


def text_to_sentences(text: str) -> list[str]:
    """A document's text as sentences: each non-blank line split with `split_sentences`."""
    return [s for line in text.splitlines() for s in split_sentences(line)]


def plan_pieces(position: int, source, tfds_data_dir: str | None = None, *, piece_mb: float) -> list[Piece]:
    """The pieces of one resolved corpus entry (about `piece_mb` of text or PIECE_EXAMPLES TFDS
    examples each), in order; together they cover it exactly once."""
    piece_bytes, piece_examples = max(1, int(piece_mb * 2**20)), PIECE_EXAMPLES
    if is_tfds(source):
        n = tfds_source.tfds_length(source, tfds_data_dir)
        return [Piece(position, i, a, min(a + piece_examples, n)) for i, a in enumerate(range(0, n, piece_examples))]
    path = pathlib.Path(source)
    ends_a_document = (lambda line: True) if path.suffix in JSONL_SUFFIXES else (lambda line: not line.strip())
    size = path.stat().st_size
    pieces: list[Piece] = []
    start, line = 0, 1
    with open(path, "rb") as f:
        while start < size:
            stop = size
            if start + piece_bytes < size:
                f.seek(start + piece_bytes)
                lines = raw_lines(f)
                at = start + piece_bytes + len(next(lines, b""))  # the rest of the line cut into
                for raw in lines:
                    at += len(raw)
                    if ends_a_document(raw):
                        stop = at
                        break
            pieces.append(Piece(position, len(pieces), start, stop, line))
            f.seek(start)
            line += sum(1 for _ in raw_lines(f, stop - start))
            start = stop
    return pieces


def _lines(path: pathlib.Path, piece: Piece, undecodable: str,
           warn: Callable[[str], None]) -> Iterator[tuple[int, str]]:
    """(line number, text) of the piece's lines as text mode reads them (\\r, \\r\\n and \\n end a line); each line
    left out as not UTF-8 (data.undecodable=skip) told to `warn`."""
    number, at = piece.first_line, piece.start
    with open(path, "rb") as f:
        f.seek(piece.start)
        for raw in raw_lines(f, piece.stop - piece.start):
            at += len(raw)
            try:
                text = raw.decode("utf-8")
            except UnicodeDecodeError as err:
                where = not_utf8(path, number, err.start, err.reason)
                if undecodable == "fail":
                    raise ValueError(f"{where}; fix the file, or set data.undecodable=skip to leave such lines out") from None
                warn(f"warning: {where}; line left out (data.undecodable=skip)")
            else:
                for part in text_lines(text.removeprefix(BOM) if number == 1 else text):
                    yield number, part
            number += 1
        if at < piece.stop:
            raise FileNotFoundError(f"{path} ended at byte {os.fstat(f.fileno()).st_size} while it was being read (it "
                                    f"was {piece.stop} bytes or more when the preparation started); it changed under "
                                    "the preparation: restore it and run the same command again")


def text_piece_documents(path: pathlib.Path, piece: Piece, undecodable: str = "fail",
                         warn: Callable[[str], None] = warn_on_stderr) -> Iterator[list[str]]:
    """Documents of a sentence-per-line file's piece (`line_documents`)."""
    return line_documents(line for _, line in _lines(path, piece, undecodable, warn))


def jsonl_piece_documents(path: pathlib.Path, piece: Piece, text_field: str = "text",
                          undecodable: str = "fail",
                          warn: Callable[[str], None] = warn_on_stderr) -> Iterator[list[str]]:
    """One document per line of a JSON Lines file's piece: the object's `text_field`, split into sentences."""
    for number, line in _lines(path, piece, undecodable, warn):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except (json.JSONDecodeError, RecursionError) as err:
            why = err.msg if isinstance(err, json.JSONDecodeError) else "nested too deeply"
            raise ValueError(f"{path}:{number} is not valid JSON ({why}); JSONL needs one object per line") from None
        if not isinstance(record, dict) or text_field not in record:
            keys = ", ".join(record) if isinstance(record, dict) else type(record).__name__
            raise ValueError(f"{path}:{number} has no {text_field!r} field (it has: {keys}); "
                             "set data.text_field to the field holding the text")
        text = record[text_field]
        if not isinstance(text, str):
            raise ValueError(f"{path}:{number}: field {text_field!r} holds {json.dumps(text)[:40]}, not text; give it "
                             "a JSON string, or set data.text_field to the field holding the text")
        try:
            check_characters(text, f"{path}:{number}: field {text_field!r}")
        except ValueError as err:
            if undecodable == "fail":
                raise ValueError(f"{err}, or set data.undecodable=skip to leave such lines out") from None
            warn(f"warning: {err}; line left out (data.undecodable=skip)")
            continue
        sentences = text_to_sentences(text)
        if sentences:
            yield sentences


def piece_documents(source, piece: Piece, text_field: str = "text", tfds_data_dir: str | None = None,
                    undecodable: str = "fail", warn: Callable[[str], None] = warn_on_stderr) -> Iterator[list[str]]:
    """The documents (lists of sentences) of one piece of a resolved corpus entry, read lazily; each text left out
    as not UTF-8 (data.undecodable=skip) told to `warn`."""
    if is_tfds(source):
        return tfds_source.tfds_range_documents(source, tfds_data_dir, text_field, piece.start, piece.stop,
                                                undecodable, warn)
    path = pathlib.Path(source)
    if not path.is_file():
        raise FileNotFoundError(f"{path} disappeared while it was being prepared; restore it and run the same "
                                "command again (finished pieces are kept)")
    if path.suffix in JSONL_SUFFIXES:
        return jsonl_piece_documents(path, piece, text_field, undecodable, warn)
    return text_piece_documents(path, piece, undecodable, warn)


def source_documents(source, text_field: str = "text", tfds_data_dir: str | None = None, undecodable: str = "fail",
                     warn: Callable[[str], None] = warn_on_stderr) -> Iterator[list[str]]:
    """Every document of a resolved corpus entry, read lazily."""
    stop = tfds_source.tfds_length(source, tfds_data_dir) if is_tfds(source) else os.stat(source).st_size
    return piece_documents(source, Piece(0, 0, 0, stop), text_field, tfds_data_dir, undecodable, warn)


def source_info(source, tfds_data_dir: str | None = None) -> dict:
    """What a manifest records about a source (without its document count)."""
    if is_tfds(source):
        return tfds_source.tfds_fingerprint(source, tfds_data_dir)
    path = pathlib.Path(source)
    stat = os.stat(path)
    return {"path": str(path.resolve()), "bytes": stat.st_size, "mtime_ns": stat.st_mtime_ns}
