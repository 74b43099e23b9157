"""SentencePiece models (unigram or BPE) through the `sentencepiece` package, with T5's sentinel ids.

A .model holds no template: `add_special_tokens=True` adds `frame`, the ids a model family's rows put around a text
(`jaxlm.data.layouts.framed` sets it), none by default. With `sentinels=N`, N ids follow the model's own:
`<extra_id_i>` is `model_size + N - 1 - i`, so `<extra_id_0>` is the last id, as in T5 (seqio's
`SentencePieceVocabulary(extra_ids=100)`, the slow `T5Tokenizer`'s `vocab_size - 1 - i`, and t5-base's
tokenizer.json: 32099 = `<extra_id_0>`); `<extra_id_i>` in a text is read as that id, as transformers reads it.
"""
from __future__ import annotations

import hashlib
import re
from pathlib import Path

import sentencepiece

SENTINEL = re.compile(r"<extra_id_(\d+)>")


def char_index_of_byte(text: str) -> list[int]:
    """For each UTF-8 byte offset of `text` (and its end), the index of the character holding it."""
    out = [i for i, ch in enumerate(text) for _ in ch.encode("utf-8")]
    return out + [len(text)]


class SentencePieceTokenizer:
    continuation_prefix = None
    word_marker = "▁"

    def __init__(self, model_path, sentinels: int = 0):
        self.model_path = Path(model_path)
        if not self.model_path.is_file():
            raise FileNotFoundError(f"SentencePiece model file not found: {self.model_path}")
        try:
            self.sp = sentencepiece.SentencePieceProcessor(model_file=str(self.model_path))
        except RuntimeError as err:  # sentencepiece's word for a file it cannot read as a model
            reason = (str(err).splitlines() or ["unreadable"])[0].removeprefix("INTERNAL: ")
            reason = reason.replace(f" from {self.model_path}", "")
            raise ValueError(f"{self.model_path} is not a SentencePiece model ({reason.rstrip('.')}); give a .model "
                             "file trained by sentencepiece") from None
        self.model_size = self.sp.get_piece_size()
        self.sentinels = sentinels
        self.vocab_size = self.model_size + sentinels
        self.unk_id, self.bos_id, self.eos_id, self.pad_id = (
            self.sp.unk_id(), self.sp.bos_id(), self.sp.eos_id(), self.sp.pad_id())
        # the ids before and after a text that `add_special_tokens=True` adds (None: none); `framed` sets them
        self.frame: tuple[int | None, int | None] = (None, None)

    def sentinel_id(self, i: int) -> int:
        if not 0 <= i < self.sentinels:
            raise ValueError(f"sentinel {i} out of range: this tokenizer has {self.sentinels} sentinels")
        return self.vocab_size - 1 - i

    def _sentinels_in(self, text: str) -> list[re.Match]:
        """The `<extra_id_i>` of `text` this tokenizer has: each is read as its sentinel id, as transformers'
        T5 tokenizers read them (a prompt for T5's span filling names them)."""
        if not self.sentinels or "<extra_id_" not in text:
            return []
        return [m for m in SENTINEL.finditer(text) if int(m.group(1)) < self.sentinels]

    def _spans(self, text: str):
        """(start, end, sentinel id or None) of `text`'s parts: sentinels, and the text around them."""
        start = 0
        for m in self._sentinels_in(text):
            yield start, m.start(), None
            yield m.start(), m.end(), self.sentinel_id(int(m.group(1)))
            start = m.end()
        yield start, len(text), None

    def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:
        ids = [i for s, e, sentinel in self._spans(text)
               for i in (self.sp.encode(text[s:e]) if sentinel is None else [sentinel])]
        return self._framed(ids) if add_special_tokens else ids

    def encode_batch(self, texts, add_special_tokens: bool = False) -> list[list[int]]:
        texts = list(texts)
        if any(self._sentinels_in(text) for text in texts):
            return [self.encode(text, add_special_tokens) for text in texts]
        batch = self.sp.encode(texts)
        return [self._framed(ids) for ids in batch] if add_special_tokens else batch

    def _framed(self, ids: list[int]) -> list[int]:
        first, last = self.frame
        return [*([first] if first is not None else []), *ids, *([last] if last is not None else [])]

    def encode_with_offsets(self, text: str) -> tuple[list[int], list[tuple[int, int]]]:
        """Ids and each piece's character span in `text` (sentencepiece reports UTF-8 byte spans of
        the original text; a piece with no surface, such as a leading "▁", has an empty span)."""
        ids, offsets = [], []
        for start, end, sentinel in self._spans(text):
            if sentinel is not None:
                ids.append(sentinel)
                offsets.append((start, end))
                continue
            part = text[start:end]
            chars = char_index_of_byte(part)
            pieces = self.sp.encode_as_proto(part).pieces
            ids += [p.id for p in pieces]
            offsets += [(start + chars[p.begin], start + chars[p.end]) for p in pieces]
        return ids, offsets

    def decode(self, ids) -> str:
        """Text of `ids`; sentinels are written as `<extra_id_i>`, with the space that a following
        "▁" piece carries kept (as transformers' T5Tokenizer does)."""
        parts, run = [], []
        for i in [*map(int, ids), None]:
            if i is not None and i < self.model_size:
                run.append(i)
                continue
            text = self.sp.decode(run)
            if parts and run and self.sp.id_to_piece(run[0]).startswith("▁"):
                text = " " + text
            parts.append(text + ("" if i is None else self.id_to_piece(i)))
            run = []
        return "".join(parts)

    def id_to_piece(self, i: int) -> str:
        if i >= self.model_size:
            return f"<extra_id_{self.vocab_size - 1 - i}>"
        return self.sp.id_to_piece(i)

    def piece_to_id(self, piece: str) -> int:
        m = SENTINEL.fullmatch(piece)
        if m and int(m.group(1)) < self.sentinels:
            return self.sentinel_id(int(m.group(1)))
        return self.sp.piece_to_id(piece)

    def token_to_id(self, token: str) -> int | None:
        """The id of `token`, None where the model does not have it (sentencepiece answers unk_id)."""
        i = self.piece_to_id(token)
        return None if i == self.unk_id and token != self.sp.id_to_piece(self.unk_id) else i

    def convert_ids_to_tokens(self, ids) -> list[str]:
        return [self.id_to_piece(int(i)) for i in ids]

    def fingerprint(self) -> str:
        h = hashlib.sha256(self.model_path.read_bytes())
        h.update(f"\0sentencepiece sentinels={self.sentinels}".encode())
        return h.hexdigest()


def train_sentencepiece(files, model_prefix, vocab_size: int, model_type: str = "unigram",
                        character_coverage: float = 1.0, input_sentence_size: int = 0,
                        **options) -> Path:
    """Train a SentencePiece model on text files (one sentence per line); returns the `.model` path.
    Further trainer flags (e.g. `max_sentence_length`, `pad_id`) pass through `options`."""
    if model_type not in ("unigram", "bpe"):
        raise ValueError(f"model_type must be 'unigram' or 'bpe', not {model_type!r}")
    files = [str(f) for f in ([files] if isinstance(files, (str, Path)) else files)]
    missing = [f for f in files if not Path(f).is_file()]
    if missing:
        raise FileNotFoundError(f"SentencePiece training file(s) not found: {', '.join(missing)}")
    Path(model_prefix).parent.mkdir(parents=True, exist_ok=True)
    sentencepiece.SentencePieceTrainer.train(
        input=files, model_prefix=str(model_prefix), vocab_size=vocab_size, model_type=model_type,
        character_coverage=character_coverage, input_sentence_size=input_sentence_size,
        shuffle_input_sentence=bool(input_sentence_size), minloglevel=2, **options)
    return Path(f"{model_prefix}.model")
