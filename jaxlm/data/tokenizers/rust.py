"""`RustTokenizer`: the tokenizer interface over a Rust `tokenizers.Tokenizer` (our WordPiece and
byte-level BPE build one; a checkpoint's tokenizer.json is one)."""
from __future__ import annotations

import hashlib
import json
from pathlib import Path

from tokenizers import AddedToken, Tokenizer, models

from jaxlm.corpora.text import utf8_text
from jaxlm.data.tokenizers.roles import ROLE_TOKENS
from jaxlm.data.tokenizers.spm import SENTINEL
from jaxlm.errors import first_line


class RustTokenizer:
    """ids, offsets, pieces and text of a Rust tokenizer (`backend`).

    `encode` adds no special tokens unless asked: `add_special_tokens=True` applies the tokenizer's
    template (BERT's [CLS] ... [SEP], a tokenizer.json's post-processor), as a model's inputs want.
    Word boundaries, for whole-word masking: pieces that continue a word start with
    `continuation_prefix` (WordPiece's "##"), or else pieces that start one with `word_marker`."""

    continuation_prefix: str | None = None
    word_marker: str | None = None

    def __init__(self, backend: Tokenizer, source: Path | None = None):
        self.backend = backend
        self.source = source
        self._hidden: tuple[int, frozenset[int]] = (-1, frozenset())  # (vocabulary size, ids) of _hidden_ids

    @classmethod
    def from_file(cls, path) -> "RustTokenizer":
        """A tokenizer.json as it is (its own special tokens and template), without padding or truncation."""
        path = Path(path)
        if not path.is_file():
            raise FileNotFoundError(f"tokenizer file not found: {path}")
        text = utf8_text(path)
        try:
            backend = Tokenizer.from_str(text)
        except Exception as err:  # noqa: BLE001 - the library raises a bare Exception for text it cannot read
            raise ValueError(f"{path} is not a tokenizers JSON file: {_why_not_a_tokenizer(text, err)}; give a "
                             "tokenizer.json saved by the tokenizers library (Tokenizer.save)") from None
        backend.no_padding()
        backend.no_truncation()
        tokenizer = cls(backend, path)
        if isinstance(backend.model, models.WordPiece):
            tokenizer.continuation_prefix = backend.model.continuing_subword_prefix
        else:
            spec = json.loads(backend.to_str())
            byte_level = _uses_byte_level(spec.get("pre_tokenizer")) or _uses_byte_level(spec.get("decoder"))
            tokenizer.word_marker = "Ġ" if byte_level else "▁"
        return tokenizer

    def mark_special_tokens(self) -> None:
        """Registers the role tokens (roles.ROLE_TOKENS) the vocabulary holds as special: `decode`
        leaves them out, and in input text they stay ordinary text."""
        vocab = self.backend.get_vocab()
        names = dict.fromkeys(name for names in ROLE_TOKENS.values() for name in names if name in vocab)
        self.backend.add_special_tokens([AddedToken(name, special=True, normalized=False) for name in names])
        self.backend.encode_special_tokens = True

    @property
    def vocab_size(self) -> int:
        return self.backend.get_vocab_size(with_added_tokens=True)

    def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:
        return self.backend.encode(text, add_special_tokens=add_special_tokens).ids

    def encode_batch(self, texts, add_special_tokens: bool = False) -> list[list[int]]:
        return [e.ids for e in self.backend.encode_batch_fast(list(texts), add_special_tokens=add_special_tokens)]

    def encode_with_offsets(self, text: str) -> tuple[list[int], list[tuple[int, int]]]:
        """Ids and each token's [start, end) character span in `text`."""
        encoding = self.backend.encode(text, add_special_tokens=False)
        return encoding.ids, [tuple(span) for span in encoding.offsets]

    def decode(self, ids) -> str:
        """Text of `ids`, special tokens left out but for T5's sentinels, written as `<extra_id_i>` as
        `SentencePieceTokenizer.decode` writes them: a T5 model's output reads the same through the run's
        SentencePiece model and through the tokenizer.json a conversion makes of it."""
        hidden = self._hidden_ids()
        return self.backend.decode([int(i) for i in ids if int(i) not in hidden], skip_special_tokens=False)

    def _hidden_ids(self) -> frozenset[int]:
        """The special tokens' ids but the sentinels', for the vocabulary as it is now (special tokens may be added
        after loading: `mark_special_tokens`)."""
        size = self.backend.get_vocab_size(with_added_tokens=True)
        if self._hidden[0] != size:
            self._hidden = (size, frozenset(i for i, token in self.backend.get_added_tokens_decoder().items()
                                            if token.special and not SENTINEL.fullmatch(token.content)))
        return self._hidden[1]

    def convert_ids_to_tokens(self, ids) -> list[str]:
        return [self.backend.id_to_token(int(i)) for i in ids]

    def token_to_id(self, token: str) -> int | None:
        return self.backend.token_to_id(token)

    def fingerprint(self) -> str:
        h = hashlib.sha256(self.backend.to_str().encode() if self.source is None else self.source.read_bytes())
        h.update(b"\0tokenizer.json")
        return h.hexdigest()


def _why_not_a_tokenizer(text: str, err: Exception) -> str:
    """Why the `tokenizers` library refused `text`: its message's first line, but for JSON with no "model" section,
    where the library names a place in the text that is fine."""
    try:
        parsed = json.loads(text)
    except ValueError:
        parsed = None
    if isinstance(parsed, dict) and "model" not in parsed:
        return 'it is JSON with no "model" section'
    return first_line(err)


def _uses_byte_level(node) -> bool:
    """Whether a tokenizer.json component (parsed JSON) is or holds a ByteLevel one."""
    if isinstance(node, dict):
        return node.get("type") == "ByteLevel" or any(_uses_byte_level(v) for v in node.values())
    if isinstance(node, list):
        return any(_uses_byte_level(v) for v in node)
    return False
