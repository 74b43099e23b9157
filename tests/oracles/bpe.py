"""Test oracle: GPT-2's byte-level BPE in pure Python, written apart from the Rust library that
jaxlm.data.tokenizers.bpe runs.

Text is split by GPT-2's pre-tokenisation pattern

    's|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+

each piece's UTF-8 bytes are mapped to printable characters (`bytes_to_unicode`) and merged pair
by pair, lowest merge rank first. The stdlib `re` has no `\\p{..}`, so the pattern is compiled with
explicit classes built from `unicodedata` (letters: categories L*, numbers: N*, spaces: the
Unicode White_Space property, as the `regex` package and Rust read `\\s`). Python 3.11's Unicode
14 tables can differ from the Rust library's only for characters assigned since.

"<|endoftext|>" in the input is ordinary text here.
"""
from __future__ import annotations

import functools
import re
import sys
import unicodedata

_WORD_CACHE_LIMIT = 1 << 20
_WHITE_SPACE = ("\t\n\x0b\x0c\r \x85\xa0\u1680\u2000\u2001\u2002\u2003\u2004\u2005\u2006\u2007"
                "\u2008\u2009\u200a\u2028\u2029\u202f\u205f\u3000")


@functools.cache
def bytes_to_unicode() -> dict[int, str]:
    """GPT-2's reversible map from bytes to printable characters (printable Latin-1 map to themselves)."""
    keep = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    shifted = [b for b in range(256) if b not in keep]
    return {**{b: chr(b) for b in keep}, **{b: chr(256 + i) for i, b in enumerate(shifted)}}


def _char_class(chars) -> str:
    ranges, codes = [], sorted(ord(c) for c in chars)
    for cp in codes:
        if ranges and ranges[-1][1] == cp - 1:
            ranges[-1][1] = cp
        else:
            ranges.append([cp, cp])
    return "".join(re.escape(chr(lo)) if lo == hi else f"{re.escape(chr(lo))}-{re.escape(chr(hi))}"
                   for lo, hi in ranges)


@functools.cache
def pretokenize_pattern() -> re.Pattern:
    letters, numbers = [], []
    for cp in range(sys.maxunicode + 1):
        cat = unicodedata.category(chr(cp))
        if cat[0] == "L":
            letters.append(chr(cp))
        elif cat[0] == "N":
            numbers.append(chr(cp))
    L, N, S = _char_class(letters), _char_class(numbers), _char_class(_WHITE_SPACE)
    return re.compile(rf"'s|'t|'re|'ve|'m|'ll|'d| ?[{L}]+| ?[{N}]+| ?[^{S}{L}{N}]+|[{S}]+(?![^{S}])|[{S}]+")


def pretokenize(text: str) -> list[tuple[int, int]]:
    """Character spans of GPT-2's pre-tokens."""
    return [m.span() for m in pretokenize_pattern().finditer(text)]


def bpe(word: str, ranks: dict[tuple[str, str], int]) -> list[str]:
    """Merge the symbols of `word` (byte characters), lowest-ranked adjacent pair first."""
    parts = list(word)
    while len(parts) > 1:
        pairs = {(a, b) for a, b in zip(parts, parts[1:])}
        best = min(pairs, key=lambda p: ranks.get(p, float("inf")))
        if best not in ranks:
            break
        merged, i = [], 0
        while i < len(parts):
            if i + 1 < len(parts) and (parts[i], parts[i + 1]) == best:
                merged.append(parts[i] + parts[i + 1])
                i += 2
            else:
                merged.append(parts[i])
                i += 1
        parts = merged
    return parts


class Gpt2Oracle:
    """`encode`, `encode_with_offsets` and `decode` of GPT-2's encoder (token -> id) and merges."""

    def __init__(self, encoder: dict[str, int], merges: list[tuple[str, str]]):
        self.encoder = encoder
        self.decoder = {i: t for t, i in encoder.items()}
        self.ranks = {pair: i for i, pair in enumerate(merges)}
        self._byte_chars = bytes_to_unicode()
        self.byte_values = {c: b for b, c in self._byte_chars.items()}
        self._cache: dict[str, tuple[tuple[int, ...], tuple[int, ...]]] = {}

    def _encode_word(self, word: str) -> tuple[tuple[int, ...], tuple[int, ...]]:
        """Ids of one pre-token and each token's length in bytes."""
        hit = self._cache.get(word)
        if hit is None:
            if len(self._cache) >= _WORD_CACHE_LIMIT:
                self._cache.clear()
            pieces = bpe("".join(self._byte_chars[b] for b in word.encode("utf-8")), self.ranks)
            hit = self._cache[word] = (tuple(self.encoder[p] for p in pieces), tuple(len(p) for p in pieces))
        return hit

    def encode(self, text: str) -> list[int]:
        return [i for s, e in pretokenize(text) for i in self._encode_word(text[s:e])[0]]

    def encode_with_offsets(self, text: str) -> tuple[list[int], list[tuple[int, int]]]:
        """Ids and each token's character span in `text` (a token that ends or starts inside a
        multi-byte character spans the whole character)."""
        ids, offsets = [], []
        for s, e in pretokenize(text):
            word = text[s:e]
            word_ids, lengths = self._encode_word(word)
            char_of_byte = [s + i for i, ch in enumerate(word) for _ in ch.encode("utf-8")]
            b = 0
            for token, n in zip(word_ids, lengths):
                ids.append(token)
                offsets.append((char_of_byte[b], char_of_byte[b + n - 1] + 1))
                b += n
        return ids, offsets

    def decode(self, ids) -> str:
        data = bytes(self.byte_values[c] for i in ids for c in self.decoder[int(i)])
        return data.decode("utf-8", errors="replace")

    def convert_ids_to_tokens(self, ids) -> list[str]:
        return [self.decoder[int(i)] for i in ids]
