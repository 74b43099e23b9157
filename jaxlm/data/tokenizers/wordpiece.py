"""BERT's WordPiece tokenizer from a vocab.txt, run by the Rust `tokenizers` library.

It is `transformers.BertTokenizer` (v5: `BertNormalizer` + `BertPreTokenizer` + `WordPiece`) with no
special tokens added unless asked and none recognised in the input ("[CLS]" in text is ordinary
text). tests/oracles/wordpiece.py is an independent pure-Python encoder the tests hold it to.
"""
from __future__ import annotations

import hashlib
from pathlib import Path

from tokenizers import Tokenizer, decoders, normalizers, pre_tokenizers, processors
from tokenizers.models import WordPiece

from jaxlm.corpora.text import text_lines, utf8_text
from jaxlm.data.tokenizers.rust import RustTokenizer

UNK, PAD, CLS, SEP, MASK = "[UNK]", "[PAD]", "[CLS]", "[SEP]", "[MASK]"
MAX_INPUT_CHARS_PER_WORD = 100
CONTINUATION = "##"


def load_vocab(path: str | Path) -> dict[str, int]:
    """One token per line, id = line number (a repeated token keeps its last line); a ValueError names the line
    where the file is not UTF-8."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"WordPiece vocab file not found: {path}")
    vocab = {line: i for i, line in enumerate(text_lines(utf8_text(path)))}
    if not vocab:
        raise ValueError(f"WordPiece vocab file is empty: {path}")
    return vocab


CASED_SHARE, CASED_FEWEST = 0.01, 10  # tokens with capitals beyond which a vocabulary was made from cased text


def check_uncased(vocab: dict[str, int], path: Path) -> None:
    """A ValueError for a cased vocabulary read lower-cased: its tokens with capitals are never produced, and text
    was split into lower-case pieces without a word (`Emma` became `e ##m ##m ##a`). Uncased vocabularies have
    none but their [SPECIAL] tokens."""
    cased = [token for token in vocab if token != token.lower() and not (token.startswith("[") and token.endswith("]"))]
    if len(cased) > max(CASED_SHARE * len(vocab), CASED_FEWEST):
        raise ValueError(f"WordPiece vocab {path} is cased ({len(cased):,} of its {len(vocab):,} tokens have capitals, "
                         f"e.g. {', '.join(cased[:3])}) but is read lower-cased, which never produces them: read it "
                         "cased (data.lowercase=false; --cased)")


def bert_words(lowercase: bool = True, strip_accents: bool | None = None):
    """(normalizer, pre-tokenizer) of BERT's basic tokenization: `normalize_str` then
    `pre_tokenize_str` give the words WordPiece segments. `strip_accents` defaults to `lowercase`."""
    normalizer = normalizers.BertNormalizer(
        clean_text=True, handle_chinese_chars=True,
        strip_accents=lowercase if strip_accents is None else strip_accents, lowercase=lowercase)
    return normalizer, pre_tokenizers.BertPreTokenizer()


class WordPieceTokenizer(RustTokenizer):
    """Role ids (`pad_id`, `unk_id`, `cls_id`, `sep_id`, `mask_id`) are None where the vocabulary
    lacks the token; only [UNK] is required, as every word WordPiece cannot split becomes it."""

    continuation_prefix = CONTINUATION

    def __init__(self, vocab_path, lowercase: bool = True, strip_accents: bool | None = None):
        self.vocab_path = Path(vocab_path)
        self.vocab = load_vocab(self.vocab_path)
        self.lowercase = lowercase
        self.strip_accents = lowercase if strip_accents is None else strip_accents
        if UNK not in self.vocab:
            raise ValueError(f"WordPiece vocab {self.vocab_path} has no {UNK} token, which every word it cannot "
                             "split becomes; add it")
        if lowercase:
            check_uncased(self.vocab, self.vocab_path)
        for attr, token in (("pad_id", PAD), ("unk_id", UNK), ("cls_id", CLS), ("sep_id", SEP), ("mask_id", MASK)):
            setattr(self, attr, self.vocab.get(token))
        backend = Tokenizer(WordPiece(self.vocab, unk_token=UNK, continuing_subword_prefix=CONTINUATION,
                                      max_input_chars_per_word=MAX_INPUT_CHARS_PER_WORD))
        backend.normalizer, backend.pre_tokenizer = bert_words(lowercase, self.strip_accents)
        backend.decoder = decoders.WordPiece(prefix=CONTINUATION)
        if self.cls_id is not None and self.sep_id is not None:
            backend.post_processor = processors.BertProcessing((SEP, self.sep_id), (CLS, self.cls_id))
        super().__init__(backend, self.vocab_path)
        self.mark_special_tokens()

    def fingerprint(self) -> str:
        h = hashlib.sha256(self.vocab_path.read_bytes())
        h.update(f"\0wordpiece lowercase={self.lowercase} strip_accents={self.strip_accents} "
                 f"max_chars={MAX_INPUT_CHARS_PER_WORD} unk={UNK} prefix={CONTINUATION}".encode())
        return h.hexdigest()
