"""`jaxlm tokenize`: ids, pieces or character offsets of each line of a file, under any of our tokenizers."""
from __future__ import annotations

import argparse
import json
from pathlib import Path

from jaxlm.data import assets
from jaxlm.data.sources import DEMO_SENTENCEPIECE, DEMO_VOCABS
from jaxlm.data.tokenizers.bpe import Gpt2Tokenizer
from jaxlm.data.tokenizers.offsets import wordpiece_offsets
from jaxlm.data.tokenizers.spm import SentencePieceTokenizer
from jaxlm.data.tokenizers.wordpiece import WordPieceTokenizer

SPEC_FORMS = (f"{', '.join(sorted(DEMO_VOCABS))} (packaged WordPiece vocab), a vocab.txt path (WordPiece), "
              f"{', '.join(sorted(DEMO_SENTENCEPIECE))} or a .model path (SentencePiece), gpt2 (packaged "
              "GPT-2 BPE), or a directory holding encoder.json and vocab.bpe (GPT-2 BPE)")


def _gpt2_from_dir(directory: Path) -> Gpt2Tokenizer:
    return Gpt2Tokenizer.from_files(directory / "encoder.json", directory / "vocab.bpe")


def load_tokenizer(spec: str, lowercase: bool = True, sentinels: int = 0):
    """A WordPiece, SentencePiece or GPT-2 tokenizer named by `spec` (see SPEC_FORMS); `lowercase`
    applies to WordPiece, `sentinels` (T5's extra ids) to SentencePiece."""
    if spec in DEMO_VOCABS:
        return WordPieceTokenizer(DEMO_VOCABS[spec](), lowercase=lowercase)
    if spec in DEMO_SENTENCEPIECE:
        return SentencePieceTokenizer(assets.sentencepiece_test_dir() / DEMO_SENTENCEPIECE[spec], sentinels=sentinels)
    if spec == "gpt2":
        return _gpt2_from_dir(assets.gpt2_tokenizer_dir())
    path = Path(spec).expanduser()
    if path.suffix == ".model":
        return SentencePieceTokenizer(path, sentinels=sentinels)
    if path.name == "vocab.txt" or path.suffix == ".txt":
        return WordPieceTokenizer(path, lowercase=lowercase)
    if path.is_dir():
        if (path / "encoder.json").is_file() and (path / "vocab.bpe").is_file():
            return _gpt2_from_dir(path)
        raise FileNotFoundError(f"tokenizer directory {path} has no encoder.json and vocab.bpe; "
                                f"--tokenizer takes {SPEC_FORMS}")
    if not path.exists() and (path.suffix or "/" in spec):
        raise FileNotFoundError(f"tokenizer file not found: {path}; a tokenizer is one of: {SPEC_FORMS}")
    raise ValueError(f"unknown tokenizer {spec!r}; a tokenizer is one of: {SPEC_FORMS}")


def encode_with_offsets(tokenizer, text: str) -> tuple[list[int], list[tuple[int, int]]]:
    if isinstance(tokenizer, WordPieceTokenizer):
        return wordpiece_offsets(tokenizer, text)
    return tokenizer.encode_with_offsets(text)


def format_line(tokenizer, text: str, pieces: bool = False, offsets: bool = False) -> str:
    if offsets:
        ids, spans = encode_with_offsets(tokenizer, text)
        return json.dumps({"ids": ids, "pieces": tokenizer.convert_ids_to_tokens(ids),
                           "offsets": [list(s) for s in spans]}, ensure_ascii=False)
    ids = tokenizer.encode(text)
    return " ".join(tokenizer.convert_ids_to_tokens(ids) if pieces else map(str, ids))


def run(args) -> None:
    source = Path(args.input).expanduser()
    if not source.is_file():
        raise FileNotFoundError(f"input file not found: {source}")
    tokenizer = load_tokenizer(args.tokenizer)
    with source.open(encoding="utf-8") as f:
        for line in f:
            print(format_line(tokenizer, line.rstrip("\r\n"), args.pieces, args.offsets))


def add_parser(subparsers) -> argparse.ArgumentParser:
    """Registers `tokenize --tokenizer SPEC --input FILE [--pieces] [--offsets]` on an argparse subparsers."""
    text = "tokenize a text file: one line of ids (or pieces, or JSON with offsets) per input line"
    sub = subparsers.add_parser("tokenize", help=text, description=text)
    sub.add_argument("--tokenizer", required=True, metavar="SPEC", help=SPEC_FORMS)
    sub.add_argument("--input", required=True, metavar="FILE", help="UTF-8 text, one sequence per line")
    sub.add_argument("--pieces", action="store_true", help="print tokens instead of ids")
    sub.add_argument("--offsets", action="store_true",
                     help="print JSON per line: ids, pieces and [start, end) character offsets")
    sub.set_defaults(handler=run, label="tokenize")
    return sub
