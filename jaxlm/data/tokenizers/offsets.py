"""Character offsets of WordPiece tokens in the original text, by aligning BERT's per-character normalisation."""
from __future__ import annotations

import functools
import re

from jaxlm.data.tokenizers.wordpiece import CONTINUATION, WordPieceTokenizer, normalize_char, wordpiece

_WORD = re.compile(r"\S+")


@functools.lru_cache(maxsize=1 << 16)
def _normalized(ch: str, lowercase: bool, strip: bool) -> str:
    return normalize_char(ch, lowercase, strip)


def normalize_with_alignment(text: str, lowercase: bool = True, strip: bool = True) -> tuple[str, list[int]]:
    """BERT's normalised text (words separated by whitespace) and, for each of its characters, the
    index of the original character it came from."""
    out, origin = [], []
    for i, ch in enumerate(text):
        norm = _normalized(ch, lowercase, strip)
        out.append(norm)
        origin.extend([i] * len(norm))
    return "".join(out), origin


def wordpiece_offsets(tokenizer: WordPieceTokenizer, text: str) -> tuple[list[int], list[tuple[int, int]]]:
    """Ids (as `tokenizer.encode`) and each token's character span in the original `text`; a piece
    that ends or starts inside one character's expansion spans the whole character, and "[UNK]"
    spans its whole word."""
    norm, origin = normalize_with_alignment(text, tokenizer.lowercase, tokenizer.strip_accents)
    unk = tokenizer.convert_ids_to_tokens([tokenizer.unk_id])[0]
    ids, offsets = [], []
    for match in _WORD.finditer(norm):
        pieces = wordpiece(match.group(), tokenizer.vocab, unk)
        if pieces == [unk]:
            lengths = [len(match.group())]
        else:
            lengths = [len(p) - len(CONTINUATION) if i else len(p) for i, p in enumerate(pieces)]
        start = match.start()
        for piece, n in zip(pieces, lengths):
            ids.append(tokenizer.vocab[piece])
            offsets.append((origin[start], origin[start + n - 1] + 1))
            start += n
    return ids, offsets
