"""`jaxlm tokenizer train`: a BERT WordPiece vocab.txt from text files."""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from jaxlm.corpora.text import check_file, check_output_file, check_plain_text, utf8_lines
from jaxlm.data.tokenizers.load import BPE_PAIR_OF, NAME_IN_A_DIRECTORY
from jaxlm.data.tokenizers.trainer import SPECIAL_TOKENS, train_wordpiece, write_vocab


def add_parser(subparsers) -> argparse.ArgumentParser:
    """Registers `tokenizer train --input FILE [FILE ...] --vocab-size N --output vocab.txt [--cased]`."""
    text = "train tokenizers"
    tokenizer = subparsers.add_parser("tokenizer", help=text, description=text)
    commands = tokenizer.add_subparsers(dest="tokenizer_command", required=True)
    text = "train a BERT WordPiece vocabulary and write it as vocab.txt"
    train = commands.add_parser("train", help=text, description=text)
    train.add_argument("--input", nargs="+", required=True, metavar="FILE", help="UTF-8 text files")
    train.add_argument("--vocab-size", type=int, required=True, help="tokens in the vocabulary, specials included")
    train.add_argument("--output", required=True, metavar="VOCAB_TXT", help="where to write vocab.txt (a .txt file)")
    train.add_argument("--cased", action="store_true", help="keep case and accents (default: lower-case)")
    train.add_argument("--min-frequency", type=int, default=2, help="merge only pairs seen this often")
    train.add_argument("--limit-alphabet", type=int, default=1000, help="keep at most this many characters")
    train.add_argument("--overwrite", action="store_true", help="replace an existing output file")
    train.set_defaults(handler=run, label="tokenizer train")
    return tokenizer


def read_lines(paths: list[Path]):
    for path in paths:
        yield from utf8_lines(path)


def _report_progress(size: int, total: int) -> None:
    if size % 1000 == 0 or size == total:
        print(f"\r{size}/{total} tokens", end="", file=sys.stderr, flush=True)


def check_vocab_name(output: Path) -> None:
    """Refuses an --output that `load_tokenizer` would not read back as a WordPiece vocab."""
    if output.name in BPE_PAIR_OF:
        raise ValueError(f"--output {output} would be read back as one file of a byte-level BPE pair; name it "
                         f"{output.with_name('vocab.txt')}")
    if NAME_IN_A_DIRECTORY.get(output.suffix) != "vocab.txt":
        raise ValueError(f"--output {output} would not be read back as a WordPiece vocab, which is a .txt file; name "
                         f"it {output.with_suffix('.txt')}")


def run(args) -> list[str]:
    output, inputs = Path(args.output), [Path(p) for p in args.input]
    check_output_file(output, args.overwrite, inputs, "an --input", makes_parents=True)
    check_vocab_name(output)
    for index, path in enumerate(inputs):
        check_file(path, "input file", "give UTF-8 text files, one sentence per line")
        check_plain_text(path, "--input")
        if path.resolve() in (earlier.resolve() for earlier in inputs[:index]):  # its words would count twice
            raise ValueError(f"--input {path} is given twice; name each file once")
    if args.vocab_size <= len(SPECIAL_TOKENS):  # found after the whole corpus was read
        raise ValueError(f"--vocab-size {args.vocab_size} is too small: its {len(SPECIAL_TOKENS)} special tokens alone "
                         "need as many, and the alphabet more; give thousands (BERT's is 30522)")
    for _ in read_lines([path for path in inputs if path.is_file()]):  # a pipe gives its lines once
        pass  # a file that is not UTF-8 is named before the minutes of training, not after them
    start = time.perf_counter()
    vocab = train_wordpiece(read_lines(inputs), args.vocab_size, lowercase=not args.cased,
                            min_frequency=args.min_frequency, limit_alphabet=args.limit_alphabet,
                            progress=_report_progress)
    seconds = time.perf_counter() - start
    print(file=sys.stderr)
    write_vocab(vocab, output)
    often = f" seen --min-frequency {args.min_frequency} times" if args.min_frequency > 1 else ""
    short = "" if len(vocab) == args.vocab_size else f" (asked for {args.vocab_size}: no pair{often} left to merge)"
    print(f"trained {len(vocab)} tokens{short} in {seconds:.1f}s -> {output}")
    return vocab
