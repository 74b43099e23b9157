"""Train a BERT WordPiece vocabulary by likelihood-scored merges of adjacent pieces."""
from __future__ import annotations

import heapq
from collections import Counter, defaultdict
from pathlib import Path
from typing import Callable, Iterable

from jaxlm.corpora.download import write_atomic
from jaxlm.data.tokenizers.wordpiece import CONTINUATION, MAX_INPUT_CHARS_PER_WORD, bert_words

SPECIAL_TOKENS = ("[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]")

Pair = tuple[str, str]


def count_words(lines: Iterable[str], lowercase: bool = True) -> Counter:
    """Word counts after BERT's basic tokenization (the normalizer and pre-tokenizer the encoder runs)."""
    normalizer, pre_tokenizer = bert_words(lowercase)
    counts: Counter = Counter()
    for line in lines:
        counts.update(word for word, _ in pre_tokenizer.pre_tokenize_str(normalizer.normalize_str(line)))
    return counts


def choose_alphabet(word_counts: Counter, limit: int) -> list[str]:
    """The `limit` most frequent characters, most frequent first (ties: by code point)."""
    chars: Counter = Counter()
    for word, n in word_counts.items():
        for ch in word:
            chars[ch] += n
    return sorted(chars, key=lambda c: (-chars[c], c))[:limit]


def initial_vocab(special_tokens: Iterable[str], alphabet: list[str]) -> list[str]:
    pieces = (p for ch in alphabet for p in (ch, CONTINUATION + ch))
    return list(dict.fromkeys([*special_tokens, *pieces]))


def split_word(word: str) -> list[str]:
    return [word[0], *(CONTINUATION + ch for ch in word[1:])]


def merged_token(left: str, right: str) -> str:
    """"##a" + "##b" -> "##ab", "a" + "##b" -> "ab": the right part always is a continuation."""
    return left + right[len(CONTINUATION):]


def merge_word(pieces: list[str], left: str, right: str, new: str) -> list[str]:
    """Every non-overlapping occurrence of (left, right), scanning left to right, becomes `new`."""
    out, i, n = [], 0, len(pieces)
    while i < n:
        if i + 1 < n and pieces[i] == left and pieces[i + 1] == right:
            out.append(new)
            i += 2
        else:
            out.append(pieces[i])
            i += 1
    return out


def pair_counts(pieces: list[str]) -> Counter:
    return Counter(zip(pieces, pieces[1:]))


class _Merges:
    """Pair counts, a pair -> words index and piece frequencies, kept up to date merge by merge.

    Candidates sit in a heap keyed (-score, -count, left, right) with score = count(ab) /
    (freq(a) * freq(b)): the best score wins, ties go to the more frequent pair, then to the
    lexicographically smaller (left, right). Entries are never removed: a popped entry whose key no
    longer matches the current statistics is stale and dropped, and every pair whose key changes is
    pushed again (those in the rewritten words, and all pairs of the two merged pieces, whose
    frequencies fell).
    """

    def __init__(self, words: list[str], counts: list[int], min_frequency: int):
        self.min_count = max(min_frequency, 1)
        self.pieces = [split_word(w) for w in words]
        self.counts = counts
        self.freq: Counter = Counter()
        self.pair_count: dict[Pair, int] = defaultdict(int)
        self.pair_words: dict[Pair, set[int]] = defaultdict(set)
        self.pairs_of: dict[str, set[Pair]] = defaultdict(set)
        for w, (pieces, n) in enumerate(zip(self.pieces, counts)):
            for piece in pieces:
                self.freq[piece] += n
            for pair, k in pair_counts(pieces).items():
                self._add_pair(pair, k * n, w)
        self.heap = [key for key in map(self._key, self.pair_count) if key is not None]
        heapq.heapify(self.heap)

    def _add_pair(self, pair: Pair, count: int, word: int) -> None:
        if pair not in self.pair_count:
            self.pairs_of[pair[0]].add(pair)
            self.pairs_of[pair[1]].add(pair)
        self.pair_count[pair] += count
        self.pair_words[pair].add(word)

    def _key(self, pair: Pair) -> tuple | None:
        count = self.pair_count.get(pair, 0)
        if count < self.min_count:
            return None
        return -count / (self.freq[pair[0]] * self.freq[pair[1]]), -count, *pair

    def _push(self, pair: Pair) -> None:
        key = self._key(pair)
        if key is not None:
            heapq.heappush(self.heap, key)

    def best(self) -> Pair | None:
        """Pops the best live pair, or None when no pair reaches `min_frequency`."""
        while self.heap:
            key = heapq.heappop(self.heap)
            pair = key[2:]
            if self._key(pair) == key:
                return pair
        return None

    def merge(self, left: str, right: str) -> str:
        new = merged_token(left, right)
        changed: set[Pair] = set()
        for w in self.pair_words.pop((left, right)):
            pieces, n = self.pieces[w], self.counts[w]
            out = merge_word(pieces, left, right, new)
            merges = len(pieces) - len(out)
            if not merges:
                continue
            self.pieces[w] = out
            self.freq[left] -= merges * n
            self.freq[right] -= merges * n
            self.freq[new] += merges * n
            before, after = pair_counts(pieces), pair_counts(out)
            for pair, k in before.items():
                if after.get(pair) != k:
                    changed.add(pair)
                    self.pair_count[pair] -= k * n
                    if not self.pair_count[pair]:
                        del self.pair_count[pair]
            for pair, k in after.items():
                if before.get(pair) != k:
                    changed.add(pair)
                    self._add_pair(pair, k * n, w)
        for piece in (left, right):
            live = {p for p in self.pairs_of[piece] if p in self.pair_count}
            self.pairs_of[piece] = live
            changed |= live
        for pair in changed:
            self._push(pair)
        return new


def train_wordpiece(lines: Iterable[str], vocab_size: int, *, lowercase: bool = True,
                    special_tokens: Iterable[str] = SPECIAL_TOKENS, min_frequency: int = 2,
                    limit_alphabet: int = 1000,
                    progress: Callable[[int, int], None] | None = None) -> list[str]:
    """A WordPiece vocabulary in id order: special tokens, the alphabet (each character as "c" and
    "##c", most frequent first), then merged pieces in the order they were merged.

    Words are counted after BERT's basic tokenization (`count_words`); each is split into characters, "##" on all but the
    first, and the adjacent pair with the highest count(ab) / (count(a) * count(b)) is merged
    everywhere, until `vocab_size` pieces or no pair occurs `min_frequency` times (then the
    vocabulary is shorter). Words with a character outside the alphabet, or longer than the encoder
    accepts, take no part in merging (the encoder maps them to [UNK] anyway). A merge that spells
    a piece already in the vocabulary is applied but adds nothing. `progress(size, vocab_size)` is
    called after each piece added.
    """
    if limit_alphabet < 1:
        raise ValueError(f"limit_alphabet {limit_alphabet} keeps no character, and every word would be [UNK]; "
                         "give 1 or more (the default keeps 1000)")
    if min_frequency < 0:
        raise ValueError(f"min_frequency {min_frequency} is a count of occurrences; give 0 or more (0 and 1 merge "
                         "every pair that occurs)")
    counts = count_words(lines, lowercase)
    if not counts:
        raise ValueError("cannot train a WordPiece vocabulary on empty input: no words in the text")
    special_tokens = tuple(special_tokens)
    alphabet = choose_alphabet(counts, limit_alphabet)
    vocab = initial_vocab(special_tokens, alphabet)
    if vocab_size < len(vocab):
        raise ValueError(
            f"vocab_size {vocab_size} is too small: {len(special_tokens)} special tokens and "
            f"{len(alphabet)} characters (each as 'c' and '##c') need at least {len(vocab)}; "
            f"raise vocab_size to {len(vocab)} or more, or lower limit_alphabet")
    keep = set(alphabet)
    words = [w for w in counts if len(w) <= MAX_INPUT_CHARS_PER_WORD and keep.issuperset(w)]
    merges = _Merges(words, [counts[w] for w in words], min_frequency)
    known = set(vocab)
    while len(vocab) < vocab_size:
        pair = merges.best()
        if pair is None:
            break
        new = merges.merge(*pair)
        if new not in known:
            known.add(new)
            vocab.append(new)
            if progress is not None:
                progress(len(vocab), vocab_size)
    return vocab


def write_vocab(tokens: Iterable[str], path: str | Path) -> Path:
    """A BERT `vocab.txt`: one token per line, id = line number; written atomically."""
    return write_atomic(Path(path), "".join(f"{token}\n" for token in tokens))
