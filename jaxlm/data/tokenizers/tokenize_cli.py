"""`jaxlm tokenize`: ids, pieces or character offsets of each line of a file, under any of our tokenizers."""
from __future__ import annotations

import argparse
import json
from pathlib import Path

from jaxlm.corpora.text import check_file, utf8_lines
from jaxlm.data.tokenizers.load import SPEC_FORMS, load_tokenizer


def format_line(tokenizer, text: str, pieces: bool = False, offsets: bool = False) -> str:
    if offsets:
        ids, spans = tokenizer.encode_with_offsets(text)
        return json.dumps({"ids": ids, "pieces": tokenizer.convert_ids_to_tokens(ids),
                           "offsets": [list(s) for s in spans]}, ensure_ascii=False)
    ids = tokenizer.encode(text)
    return " ".join(tokenizer.convert_ids_to_tokens(ids) if pieces else map(str, ids))


def run(args) -> None:
    source = Path(args.input).expanduser()
    check_file(source, "input file", "give a UTF-8 text file, one sequence per line")
    tokenizer = load_tokenizer(args.tokenizer, lowercase=not args.cased)
    if args.cased and getattr(tokenizer, "lowercase", True):
        raise ValueError(f"--cased changes only a WordPiece vocab.txt; {args.tokenizer} keeps or folds case as it was "
                         "made (or as its tokenizer_config.json says): remove --cased")
    lines = utf8_lines(source)
    if source.is_file():  # read whole before anything is printed: a bad line 5,000 lines in left them half written
        for _ in utf8_lines(source):
            pass
    else:  # a pipe gives its lines once
        lines = list(lines)
    for line in lines:
        print(format_line(tokenizer, line, args.pieces, args.offsets))


def add_parser(subparsers) -> argparse.ArgumentParser:
    """Registers `tokenize --tokenizer SPEC --input FILE [--pieces] [--offsets]` on an argparse subparsers."""
    text = "tokenize a text file: one line of ids (or pieces, or JSON with offsets) per input line"
    sub = subparsers.add_parser("tokenize", help=text, description=text)
    sub.add_argument("--tokenizer", required=True, metavar="SPEC", help=SPEC_FORMS)
    sub.add_argument("--input", required=True, metavar="FILE", help="UTF-8 text, one sequence per line")
    sub.add_argument("--cased", action="store_true", help="keep case and accents with a WordPiece vocab.txt (as "
                     "`tokenizer train --cased` learns it; default: lower-case, as BERT uncased)")
    sub.add_argument("--pieces", action="store_true", help="print tokens instead of ids")
    sub.add_argument("--offsets", action="store_true",
                     help="print JSON per line: ids, pieces and [start, end) character offsets")
    sub.set_defaults(handler=run, label="tokenize")
    return sub
