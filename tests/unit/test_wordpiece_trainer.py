"""WordPiece trainer: hand-checked merges, a naive reference, and vocab.txt files BERT tokenizers accept."""
import argparse
import itertools
from collections import Counter

import pytest

from jaxlm.corpora.registry import fetch_austen
from jaxlm.data.tokenizers.trainer import (SPECIAL_TOKENS, choose_alphabet, count_words, initial_vocab,
                                           merge_word, merged_token, split_word, train_wordpiece, write_vocab)
from jaxlm.data.tokenizers.trainer_cli import add_parser, run
from jaxlm.data.tokenizers.wordpiece import UNK, WordPieceTokenizer, load_vocab

AUSTEN_LINES = 5000
AUSTEN_VOCAB = 3000

# The Hugging Face course's WordPiece example: word -> count.
TOY = {"hug": 10, "pug": 5, "pun": 12, "bun": 4, "hugs": 5}
# Alphabet by character count: u 36, g 20, p 17, n 16, h 15, s 5, b 4, so 5 specials + 14 pieces.
#
# Start: freq h 15, p 17, b 4, ##u 36, ##g 20, ##n 16, ##s 5.
#   (h,##u) 15/(15*36) = 1/36   (##u,##g) 20/(36*20) = 1/36   (p,##u) 17/(17*36) = 1/36
#   (##u,##n) 16/(36*16) = 1/36  (b,##u) 4/(4*36) = 1/36      (##g,##s) 5/(20*5) = 1/20  <- best
# 1. "##gs". hugs = h ##u ##gs; freq ##g 15, ##s 0, ##gs 5.
#   (h,##u) 15/(15*36), (##u,##g) 15/(36*15), (##u,##gs) 5/(36*5), (p,##u) 17/(17*36),
#   (##u,##n) 16/(36*16), (b,##u) 4/(4*36): all exactly 1/36, so the larger count wins: (p,##u) 17.
# 2. "pu". pug = pu ##g, pun = pu ##n; freq p 0, ##u 19, pu 17.
#   (h,##u) 15/(15*19) = 1/19   (##u,##g) 10/(19*15) = 2/57   (##u,##gs) 5/(19*5) = 1/19
#   (pu,##g) 5/(17*15) = 1/51   (pu,##n) 12/(17*16) = 3/68    (b,##u) 4/(4*19) = 1/19
#   (##u,##n) 4/(19*16) = 1/76: three tie at 1/19; counts 15, 5, 4, so (h,##u).
# 3. "hu". hug = hu ##g, hugs = hu ##gs; freq h 0, ##u 4, hu 15.
#   (hu,##g) 10/(15*15) = 2/45  (hu,##gs) 5/(15*5) = 1/15   (pu,##g) 5/(17*15) = 1/51
#   (pu,##n) 12/(17*16) = 3/68  (b,##u) 4/(4*4) = 1/4 <- best (##u,##n) 4/(4*16) = 1/16
# 4. "bu". bun = bu ##n; freq b 0, ##u 0, bu 4.
#   (hu,##g) 2/45   (hu,##gs) 1/15 <- best   (pu,##g) 1/51   (pu,##n) 3/68   (bu,##n) 4/(4*16) = 1/16
# 5. "hugs".
TOY_MERGES = ["##gs", "pu", "hu", "bu", "hugs"]


def toy_lines():
    return [word for word, n in TOY.items() for _ in range(n)]


def naive_wordpiece(lines, vocab_size, min_frequency=2):
    """The algorithm with every count recomputed from scratch before each merge."""
    counts = count_words(lines)
    vocab = initial_vocab(SPECIAL_TOKENS, choose_alphabet(counts, 1000))
    words = {w: split_word(w) for w in counts if len(w) <= 100}
    while len(vocab) < vocab_size:
        freq, pairs = Counter(), Counter()
        for w, pieces in words.items():
            for piece in pieces:
                freq[piece] += counts[w]
            for pair in zip(pieces, pieces[1:]):
                pairs[pair] += counts[w]
        candidates = [(-n / (freq[a] * freq[b]), -n, a, b) for (a, b), n in pairs.items() if n >= min_frequency]
        if not candidates:
            break
        _, _, a, b = min(candidates)
        new = merged_token(a, b)
        words = {w: merge_word(pieces, a, b, new) for w, pieces in words.items()}
        if new not in vocab:
            vocab.append(new)
    return vocab


@pytest.fixture(scope="module")
def austen_lines():
    with fetch_austen().open(encoding="utf-8") as f:
        return [line.rstrip("\n") for line in itertools.islice(f, AUSTEN_LINES)]


@pytest.fixture(scope="module")
def austen_vocab(austen_lines):
    return train_wordpiece(austen_lines, AUSTEN_VOCAB)


def test_toy_merge_order_worked_by_hand():
    base = len(SPECIAL_TOKENS) + 2 * 7
    vocab = train_wordpiece(toy_lines(), base + len(TOY_MERGES))
    assert vocab[:len(SPECIAL_TOKENS)] == list(SPECIAL_TOKENS)
    assert vocab[len(SPECIAL_TOKENS):base] == ["u", "##u", "g", "##g", "p", "##p", "n", "##n",
                                               "h", "##h", "s", "##s", "b", "##b"]
    assert vocab[base:] == TOY_MERGES


def test_stops_when_no_pair_is_frequent_enough():
    vocab = train_wordpiece(toy_lines(), 1000)
    assert vocab[-9:] == TOY_MERGES + ["hug", "bun", "pun", "pug"]
    # Pairs seen at least 11 times: ##ug (1/36, count 20), then ##un (16/(16*16)), hug, pun.
    assert train_wordpiece(toy_lines(), 1000, min_frequency=11) == vocab[:19] + ["##ug", "##un", "hug", "pun"]


def test_merge_rules():
    assert merged_token("##a", "##b") == "##ab" and merged_token("a", "##bc") == "abc"
    assert split_word("hug") == ["h", "##u", "##g"]
    assert merge_word(["a", "##a", "##a", "##a"], "##a", "##a", "##aa") == ["a", "##aa", "##a"]


def test_incremental_matches_naive_reference(austen_lines):
    lines = austen_lines[:300]
    assert train_wordpiece(lines, 300) == naive_wordpiece(lines, 300)


def test_austen_vocab_shape_and_determinism(austen_lines, austen_vocab):
    assert len(austen_vocab) == AUSTEN_VOCAB
    assert len(set(austen_vocab)) == AUSTEN_VOCAB
    assert austen_vocab[:len(SPECIAL_TOKENS)] == list(SPECIAL_TOKENS)
    base = len(initial_vocab(SPECIAL_TOKENS, choose_alphabet(count_words(austen_lines), 1000)))
    for i, token in enumerate(austen_vocab[base:], base):
        earlier = set(austen_vocab[:i])
        start = 3 if token.startswith("##") else 1
        assert any(token[:k] in earlier and "##" + token[k:] in earlier for k in range(start, len(token))), token
    # The score favours pieces whose parts are rare: whole frequent words like "the" come late.
    assert {"emma", "of", "to"} <= set(austen_vocab)
    assert train_wordpiece(iter(austen_lines), AUSTEN_VOCAB) == austen_vocab


def test_austen_vocab_txt_matches_transformers(austen_lines, austen_vocab, tmp_path):
    transformers = pytest.importorskip("transformers")
    path = write_vocab(austen_vocab, tmp_path / "vocab.txt")
    assert load_vocab(path) == {t: i for i, t in enumerate(austen_vocab)}
    ours = WordPieceTokenizer(path)
    # transformers 5 ignores vocab_file=: the vocabulary goes in vocab=.
    hf = transformers.BertTokenizer(vocab=load_vocab(path), do_lower_case=True)
    assert len(hf) == AUSTEN_VOCAB
    want = hf(austen_lines, add_special_tokens=False, split_special_tokens=True)["input_ids"]
    got = [ours.encode(line) for line in austen_lines]
    assert got == want
    ids = [i for line in got for i in line]
    assert sum(i == ours.unk_id for i in ids) < 0.01 * len(ids)
    assert ours.unk_id == austen_vocab.index(UNK)


def test_cased_keeps_case(austen_lines):
    vocab = train_wordpiece(austen_lines[:300], 250, lowercase=False)
    assert "E" in vocab and "##É" not in vocab


def test_bad_input():
    with pytest.raises(ValueError, match="at least 19"):
        train_wordpiece(toy_lines(), 18)
    with pytest.raises(ValueError, match="empty input"):
        train_wordpiece([], 100)
    with pytest.raises(ValueError, match="empty input"):
        train_wordpiece(["   ", "\t\x00"], 100)
    with pytest.raises(ValueError, match="limit_alphabet 0 keeps no character"):  # once a 5-token vocabulary
        train_wordpiece(toy_lines(), 100, limit_alphabet=0)
    with pytest.raises(ValueError, match="min_frequency -1 is a count"):  # once taken as 1
        train_wordpiece(toy_lines(), 100, min_frequency=-1)


def cli_args(argv):
    top = argparse.ArgumentParser()
    add_parser(top.add_subparsers(dest="command", required=True))
    return top.parse_args(argv)


def test_cli_trains_and_refuses_to_overwrite(austen_lines, tmp_path, capsys):
    text = tmp_path / "a.txt"
    text.write_text("\n".join(austen_lines[:200]), encoding="utf-8")
    extra = tmp_path / "b.txt"
    extra.write_text("\n".join(toy_lines()), encoding="utf-8")
    output = tmp_path / "out" / "vocab.txt"
    argv = ["tokenizer", "train", "--input", str(text), str(extra), "--vocab-size", "300", "--output", str(output)]
    args = cli_args(argv)
    assert args.handler is run
    vocab = run(args)
    assert "trained 300 tokens in" in capsys.readouterr().out
    assert output.read_text(encoding="utf-8").split("\n") == vocab + [""]
    assert vocab == train_wordpiece(austen_lines[:200] + toy_lines(), 300)
    assert output.stat().st_mode & 0o777 == 0o644  # once 0600, its temporary file's mode

    with pytest.raises(ValueError, match="is a directory; name a file"):
        run(cli_args([*argv[:-1], str(output.parent), "--overwrite"]))
    with pytest.raises(ValueError, match="is an --input file, which writing would replace"):  # --overwrite replaced it
        run(cli_args([*argv[:-1], str(extra), "--overwrite"]))
    assert extra.read_text(encoding="utf-8") == "\n".join(toy_lines())

    output.write_text("keep me", encoding="utf-8")
    with pytest.raises(FileExistsError, match="--overwrite"):
        run(cli_args(argv))
    assert output.read_text(encoding="utf-8") == "keep me"
    run(cli_args(argv + ["--overwrite", "--cased"]))
    assert "E" in load_vocab(output)

    with pytest.raises(FileNotFoundError, match="missing.txt"):
        run(cli_args(["tokenizer", "train", "--input", str(tmp_path / "missing.txt"), "--vocab-size", "300",
                      "--output", str(tmp_path / "other.txt")]))
