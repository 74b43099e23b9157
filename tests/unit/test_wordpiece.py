"""WordPieceTokenizer (Rust `tokenizers`) and the pure-Python oracle both give transformers.BertTokenizer's ids."""
import re
import time

import pytest
from oracles.wordpiece import WordPieceOracle, normalize_char

from jaxlm.corpora.models import bert_vocab_path
from jaxlm.corpora.registry import fetch_demo_corpus
from jaxlm.data.tokenizers.wordpiece import WordPieceTokenizer, bert_words, load_vocab

transformers = pytest.importorskip("transformers")

# (lowercase, strip_accents) for us; the same settings for transformers.BertTokenizer.
SETTINGS = [(True, None), (False, None), (False, True), (True, False)]

TRICKY = [
    "",
    "   \n\t ",
    "Hello, World!",
    "Café Naïve résumé ÅNGSTRÖM Ångström",
    "e\u0301 a\u0323\u0302 o\u0308\u0301 combining",
    "中文字 and 日本語の文字 한국어 豈 x\U0002B820y x\U0002B920y",
    "don't--stop!! (really?) [yes] {no} <tag> a/b\\c ~`^_|@#$%&*+=",
    "3.14159 1,000,000 $5.00 50% #1 e-mail",
    "https://example.com/a?b=c&d=e user@example.org",
    "a\x00b\x01c\x7fd\ufffde\u200bf\u200dg\u00adh\ue000i",
    "tab\there\u00a0nbsp\u3000ideo\u2028line\u2029para\x0bvt\x0cff\x85nel\x1cfs\r\ncrlf",
    "a" * 100,
    "a" * 101,
    "b" * 99 + "é",
    "supercalifragilisticexpialidocious " * 3,
    "I \u2764\ufe0f \U0001F917 \U0001F600\U0001F44D\U0001F3FD flags \U0001F1EC\U0001F1E7",
    "[CLS] hello [SEP] [MASK] [PAD] [UNK] ##ing",
    "ΟΔΟΣ Σίσυφος ΣΑΣ",
    "İstanbul ǅemal ß Straße ﬁ ½ ² Ⅻ",
    "ＡＢＣ！ full-width ｶﾀｶﾅ",
    "مَرْحَبًا नमस्ते สวัสดี שָׁלוֹם",
    "\u1fef x\u1fefy \u0387 x;y x\u037ey",
    "x\u0378y x\u166dy x\u2e43y x\U000111C9y x\u1734y \U00011938",
    "\u1c89 \ua7cb \U00010d50",
]


@pytest.fixture(scope="module")
def vocab_path():
    return bert_vocab_path()


@pytest.fixture(scope="module")
def tok(vocab_path):
    return WordPieceTokenizer(vocab_path)


@pytest.fixture(scope="module")
def oracle(vocab_path):
    return WordPieceOracle(load_vocab(vocab_path))


def hf_tokenizer(vocab_path, lowercase, strip_accents):
    # transformers 5 silently ignores vocab_file= (leaving a 5-token vocab): the path goes in vocab=.
    hf = transformers.BertTokenizer(vocab=str(vocab_path), do_lower_case=lowercase,
                                    strip_accents=strip_accents)
    assert len(hf) == 30522
    return hf


def hf_encode(hf, texts):
    # split_special_tokens: "[CLS]" in the text is plain text, as for our tokenizer.
    return hf(texts, add_special_tokens=False, split_special_tokens=True)["input_ids"]


def first_difference(texts, got, want):
    for i, (text, g, w) in enumerate(zip(texts, got, want)):
        if g != w:
            return f"line {i}: {text!r}\n got  {g}\n want {w}"
    return None


def test_demo_corpus_matches_transformers(tok, oracle, vocab_path):
    hf = hf_tokenizer(vocab_path, True, None)
    timings = []
    for path in fetch_demo_corpus():
        lines = path.read_text(encoding="utf-8").split("\n")
        want = hf_encode(hf, lines)
        start = time.perf_counter()
        reference = [oracle.encode(line) for line in lines]
        oracle_s = time.perf_counter() - start
        diff = first_difference(lines, reference, want)
        assert diff is None, f"{path.name}: oracle vs transformers.BertTokenizer, {diff}"
        start = time.perf_counter()
        ours = tok.encode_batch(lines)
        batch_s = time.perf_counter() - start
        diff = first_difference(lines, ours, want)
        assert diff is None, f"{path.name}: encode_batch vs transformers.BertTokenizer, {diff}"
        diff = first_difference(lines, [tok.encode(line) for line in lines], want)
        assert diff is None, f"{path.name}: encode vs transformers.BertTokenizer, {diff}"
        mb = path.stat().st_size / 1e6
        timings.append(f"{path.name}: {mb:.1f} MB, {sum(map(len, ours))} ids, encode_batch {batch_s:.2f}s, "
                       f"oracle {oracle_s:.1f}s")
    print("\n".join(timings))


@pytest.mark.parametrize("lowercase,strip_accents", SETTINGS)
def test_tricky_strings_match_transformers(vocab_path, lowercase, strip_accents):
    tok = WordPieceTokenizer(vocab_path, lowercase=lowercase, strip_accents=strip_accents)
    oracle = WordPieceOracle(load_vocab(vocab_path), lowercase=lowercase, strip_accents=strip_accents)
    want = hf_encode(hf_tokenizer(vocab_path, lowercase, strip_accents), TRICKY)
    diff = first_difference(TRICKY, [oracle.encode(text) for text in TRICKY], want)
    assert diff is None, f"oracle vs transformers.BertTokenizer, {diff}"
    ours = [tok.encode(text) for text in TRICKY]
    diff = first_difference(TRICKY, ours, want)
    assert diff is None, f"encode vs transformers.BertTokenizer, {diff}"
    diff = first_difference(TRICKY, tok.encode_batch(TRICKY), ours)
    assert diff is None, f"encode_batch vs encode, {diff}"
    for text, ids in zip(TRICKY, ours):
        assert oracle.tokenize(text) == tok.convert_ids_to_tokens(ids)


def test_examples(tok, oracle):
    pieces = lambda text: tok.convert_ids_to_tokens(tok.encode(text))
    assert pieces("Café Naïve don't--stop!!") == [
        "cafe", "naive", "don", "'", "t", "-", "-", "stop", "!", "!"]
    assert pieces("[CLS] 中文") == ["[", "cl", "##s", "]", "中", "文"]
    assert pieces("a" * 101) == ["[UNK]"]
    assert pieces("unaffable") == ["una", "##ffa", "##ble"] == oracle.tokenize("unaffable")
    assert tok.encode("") == [] and tok.encode_batch([]) == []


def test_special_tokens_only_when_asked(tok, vocab_path):
    """A model's inputs: [CLS] ... [SEP] as transformers adds them; decode leaves them out."""
    hf = hf_tokenizer(vocab_path, True, None)
    for text in TRICKY:
        ids = tok.encode(text, add_special_tokens=True)
        assert ids == hf(text, split_special_tokens=True)["input_ids"] == [101, *tok.encode(text), 102]
        assert tok.decode(ids) == hf.decode(ids, skip_special_tokens=True)
    assert tok.encode_batch(["Hello", ""], add_special_tokens=True) == [[101, 7592, 102], [101, 102]]


@pytest.mark.parametrize("lowercase,strip_accents", [(True, True), (False, False)])
def test_every_code_point_matches_tokenizers(tok, lowercase, strip_accents):
    """The oracle's per-character normalization and punctuation splitting agree with the Rust library's
    (the normalizer and pre-tokenizer the package runs) on all of Unicode."""
    normalizer, pre_tokenizer = bert_words(lowercase, strip_accents)
    code_points = [cp for cp in range(0x110000) if not 0xD800 <= cp <= 0xDFFF]
    table = {}
    for i in range(0, len(code_points), 4096):
        chunk = code_points[i:i + 4096]
        text = " ".join(f"x{chr(cp)}y\u00c1{chr(cp)}" for cp in chunk)
        want = [w for w, _ in pre_tokenizer.pre_tokenize_str(normalizer.normalize_str(text))]
        for ch in text:
            if ch not in table:
                table[ch] = normalize_char(ch, lowercase, strip_accents)
        got = "".join(table[ch] for ch in text).split()
        if got != want:
            bad = [hex(cp) for cp in chunk if normalize_char(chr(cp), lowercase, strip_accents).split()
                   != [w for w, _ in pre_tokenizer.pre_tokenize_str(normalizer.normalize_str(chr(cp)))]]
            pytest.fail(f"normalize_char differs from tokenizers for code points {bad[:50]}")


def test_special_ids(tok):
    assert (tok.pad_id, tok.unk_id, tok.cls_id, tok.sep_id, tok.mask_id) == (0, 100, 101, 102, 103)
    assert tok.vocab_size == len(tok.vocab) == 30522
    assert tok.token_to_id("[MASK]") == 103 and tok.token_to_id("no-such-token") is None
    assert tok.convert_ids_to_tokens([101, 102, 103]) == ["[CLS]", "[SEP]", "[MASK]"]


def test_fingerprint(tok, vocab_path, tmp_path):
    assert tok.fingerprint() == WordPieceTokenizer(vocab_path).fingerprint()
    assert len(tok.fingerprint()) == 64
    assert tok.fingerprint() != WordPieceTokenizer(vocab_path, lowercase=False).fingerprint()
    assert tok.fingerprint() != WordPieceTokenizer(vocab_path, strip_accents=False).fingerprint()
    edited = tmp_path / "vocab.txt"
    edited.write_bytes(vocab_path.read_bytes() + b"zzzz\n")
    assert tok.fingerprint() != WordPieceTokenizer(edited).fingerprint()


def test_bad_vocab_files(tmp_path):
    missing = tmp_path / "nope" / "vocab.txt"
    with pytest.raises(FileNotFoundError, match=re.escape(str(missing))):
        WordPieceTokenizer(missing)
    empty = tmp_path / "empty.txt"
    empty.write_text("")
    with pytest.raises(ValueError, match="empty"):
        WordPieceTokenizer(empty)
    no_unk = tmp_path / "no-unk.txt"
    no_unk.write_text("[PAD]\n[CLS]\n[SEP]\n[MASK]\nhello\n")
    with pytest.raises(ValueError, match=r"no-unk\.txt has no \[UNK\]"):
        WordPieceTokenizer(no_unk)


def test_roles_a_vocab_lacks_are_none(tmp_path):
    """Google BERT's test vocabulary has no [PAD] or [MASK]: it tokenizes; only padding or masking needs them."""
    vocab = tmp_path / "vocab.txt"
    vocab.write_text("[UNK]\n[CLS]\n[SEP]\nwant\n##want\n##ed\nwa\nun\nrunn\n##ing\n,\n")
    tok = WordPieceTokenizer(vocab)
    assert (tok.pad_id, tok.unk_id, tok.cls_id, tok.sep_id, tok.mask_id) == (None, 0, 1, 2, None)
    assert tok.encode("UNwant\u00e9d,running") == [7, 4, 5, 10, 8, 9]
    assert tok.encode("unwanted running", add_special_tokens=True) == [1, 7, 4, 5, 8, 9, 2]
