"""BERT's pretraining text format (UTF-8, one sentence per line, a blank line between documents):
prose split into sentences, documents written in it and read back."""
from __future__ import annotations

import pathlib
import re
import sys
import tempfile
from typing import Iterable, Iterator, Sequence

from jaxlm.train.storage import in_cloud

_BOUNDARY = re.compile(r"[.!?]+[\"')\]\u2019\u201d]*\s+(?=[A-Z0-9\"'(\[\u2018\u201c])")
_ABBREVIATION = re.compile(
    r"(?:^|[^A-Za-z])(?:Mr|Mrs|Ms|Messrs|Mme|Dr|St|Sr|Jr|Prof|Rev|Col|Gen|Maj|Capt|Lt|Sgt|Brig|Adm"
    r"|Gov|Sen|Mt|Ft|Vol|vs|cf|ca|c|approx|al|e\.g|i\.e|[A-Z])\.$"
)


def split_sentences(text: str) -> list[str]:
    """Split prose after . ! ? (and closing quotes/brackets) before an uppercase letter, quote or
    digit, except after common abbreviations and single initials."""
    text = " ".join(text.split())
    sentences, start = [], 0
    for match in _BOUNDARY.finditer(text):
        if match.group().rstrip() == "." and _ABBREVIATION.search(text[start : match.start() + 1]):
            continue
        sentences.append(text[start : match.end()].strip())
        start = match.end()
    sentences.append(text[start:].strip())
    return [s for s in sentences if s]


BOM = "\ufeff"  # a byte-order mark some editors put first in a UTF-8 file: not text


def text_lines(text: str) -> list[str]:
    """`text`'s lines as Python's text mode reads them: \\r\\n, \\r and \\n end a line (a form feed or U+2028
    does not, as it would for str.splitlines())."""
    parts = text.replace("\r\n", "\n").replace("\r", "\n").split("\n")
    return parts[:-1] if parts[-1] == "" else parts


def raw_lines(f, limit: int | None = None, block_size: int = 1 << 16) -> Iterator[bytes]:
    """The lines of a binary file from where it stands (the next `limit` bytes, or to its end), each with its ending
    as Python's text mode ends lines (\\r\\n, \\r or \\n), where readline() would end them at \\n alone. The file
    is read ahead of the lines yielded: count their lengths, not f.tell(), to know where a line ends."""
    pending: list[bytes] = []
    left = float("inf") if limit is None else limit
    while left > 0 and (block := f.read(int(min(block_size, left)))):
        left -= len(block)
        if b"\n" not in block and b"\r" not in block:
            pending.append(block)
            continue
        lines = (b"".join(pending) + block).splitlines(keepends=True)
        # a last line without its ending, or ending in \r that a \n in the next block may complete, waits
        pending = [lines.pop()] if not lines[-1].endswith(b"\n") else []
        yield from lines
    if pending:
        yield b"".join(pending)


def not_utf8(path, number: int, column: int, reason: str) -> str:
    """Where a file stops being UTF-8, as every reader of text says it."""
    return f"{path}:{number}: not UTF-8 (byte {column} of the line: {reason})"


def warn_on_stderr(message: str) -> None:
    """How a reader that leaves out text that is not UTF-8 (data.undecodable=skip) says so, unless told otherwise."""
    print(message, file=sys.stderr)


def check_file(path: pathlib.Path, what: str, fix: str) -> None:
    """An OSError that says "`what` PATH is a directory" or "does not exist", then `fix`; a file (or pipe) passes."""
    if path.is_dir():
        raise IsADirectoryError(f"{what} {path} is a directory; {fix}")
    if not path.exists():
        raise FileNotFoundError(f"{what} {path} does not exist; {fix}")


def check_plain_text(path: pathlib.Path, what: str) -> None:
    """A ValueError for a JSON Lines file (by its .jsonl suffix) given where plain text is read line by line: its
    JSON syntax would be read as text (a vocabulary learnt `{`, `"` and its keys; embeddings of whole records)."""
    if pathlib.Path(path).suffix.lower() == ".jsonl":
        raise ValueError(f"{what} {path} is JSON Lines, and this reads plain text, one sentence per line; give a .txt "
                         "file of the records' text (jaxlm prepare reads JSON Lines, by data.text_field)")


def file_in_the_way(path: pathlib.Path) -> pathlib.Path | None:
    """What is not a directory at `path` or at one of the directories above it, where a directory is needed; None
    when nothing is in the way."""
    path = pathlib.Path(path).absolute()
    return next((p for p in (path, *path.parents) if p.exists() and not p.is_dir()), None)


def check_output_file(path: pathlib.Path, overwrite: bool, input_files: Sequence[pathlib.Path] = (),
                      input_name: str = "the input", makes_parents: bool = False) -> None:
    """Refuses an --output that is a directory, is one of `input_files` (which writing would replace), exists
    without `overwrite` or lies in a directory that does not exist (unless the writer `makes_parents`) or is a file."""
    if path.is_dir():
        raise ValueError(f"--output {path} is a directory; name a file")
    if any(path.resolve() == pathlib.Path(given).resolve() for given in input_files):
        raise ValueError(f"--output {path} is {input_name} file, which writing would replace; name another file")
    if path.exists() and not overwrite:
        raise FileExistsError(f"--output {path} exists; pass --overwrite to replace it or choose another file")
    parent = path.absolute().parent
    blocked = file_in_the_way(parent)
    if blocked is not None:
        raise FileNotFoundError(f"--output {path}: directory {blocked} is a file")
    if not parent.is_dir() and not makes_parents:
        raise FileNotFoundError(f"--output {path}: directory {parent} does not exist; create it, or name a file in "
                                "a directory that exists")
    check_writable(parent, f"--output {path}")


def check_writable(directory: pathlib.Path, what: str) -> None:
    """A PermissionError saying that `what` cannot be written in `directory`, or in the directory above it that exists
    (a read-only disk, no permission), found by making and removing a file there: before the work whose result would
    have nowhere to go. A cloud URI (gs://...) is left to its store."""
    if in_cloud(directory):
        return
    directory = pathlib.Path(directory).absolute()
    directory = next(p for p in (directory, *directory.parents) if p.is_dir())
    try:
        tempfile.NamedTemporaryFile(dir=directory).close()
    except OSError as err:
        raise PermissionError(f"{what}: cannot write in {directory} ({err.strerror}); choose a directory you can "
                              "write to") from None


def check_characters(text: str, where: str) -> None:
    """ValueError for a text with half a surrogate pair ("\\ud83d" alone, which JSON lets through), which no tokenizer
    reads; `where` says where the text is ("FILE: examples[3]")."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as err:
        raise ValueError(f"{where} holds {text[max(0, err.start - 20):err.end + 20]!r}, with half a surrogate pair "
                         "(a \\uD800-\\uDFFF escape alone), not a character; fix the file") from None


def utf8_text(path: pathlib.Path) -> str:
    """A UTF-8 text file's contents, without a byte-order mark; a ValueError names the first line that is not
    UTF-8."""
    data = pathlib.Path(path).read_bytes()
    try:
        return data.decode("utf-8").removeprefix(BOM)
    except UnicodeDecodeError as err:
        ended = data[:err.start].splitlines(keepends=True)
        started = ended.pop() if ended and not ended[-1].endswith((b"\r", b"\n")) else b""
        number, column = len(ended) + 1, len(started)
        raise ValueError(f"{not_utf8(path, number, column, err.reason)}; save the file as UTF-8") from None


def utf8_lines(path: pathlib.Path) -> Iterator[str]:
    """A UTF-8 text file's lines (`text_lines`), read as they are needed, without a byte-order mark; a ValueError
    names the first line that is not UTF-8, or holds a NUL byte (UTF-16 without its byte-order mark decodes as
    UTF-8 with a NUL beside each ASCII letter, and a binary file as anything)."""
    with open(path, "rb") as f:
        for number, raw in enumerate(raw_lines(f), 1):
            try:
                text = raw.decode("utf-8")
            except UnicodeDecodeError as err:
                raise ValueError(f"{not_utf8(path, number, err.start, err.reason)}; save the file as UTF-8") from None
            if "\0" in text:
                raise ValueError(f"{path}:{number}: a NUL byte at column {text.index(chr(0)) + 1}: a UTF-16 or binary "
                                 "file, not UTF-8 text; save the file as UTF-8")
            yield from text_lines(text.removeprefix(BOM) if number == 1 else text)


def format_documents(documents: Iterable[list[str]]) -> str:
    """BERT pretraining text: one sentence per line, a blank line between non-empty documents."""
    return "\n\n".join("\n".join(doc) for doc in documents if doc) + "\n"


def line_documents(lines: Iterable[str]) -> Iterator[list[str]]:
    """Documents of sentence-per-line text, as they end: blank lines separate documents; empty ones dropped."""
    document: list[str] = []
    for line in lines:
        line = line.strip()
        if line:
            document.append(line)
        elif document:
            yield document
            document = []
    if document:
        yield document


def text_documents(path: pathlib.Path) -> list[list[str]]:
    """Documents of a sentence-per-line file (`line_documents`)."""
    with open(path, encoding="utf-8") as f:
        return list(line_documents(f))


def repeated_copy(paths: Iterable[pathlib.Path]) -> str:
    """What `write_repeated` copies over and over: the documents of `paths` (BERT text format)."""
    return "".join(pathlib.Path(p).read_text(encoding="utf-8").strip("\n") + "\n\n" for p in paths)


def write_repeated(paths: Iterable[pathlib.Path], target: pathlib.Path, size: int) -> None:
    """A corpus of at least `size` bytes at `target`: whole copies of `repeated_copy(paths)` (a stand-in for a
    large corpus where only the amount matters)."""
    documents = repeated_copy(paths)
    tmp = target.with_name(target.name + ".tmp")
    with open(tmp, "w", encoding="utf-8") as f:
        for _ in range(-(-size // len(documents.encode("utf-8")))):
            f.write(documents)
    tmp.replace(target)
