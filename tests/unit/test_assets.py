"""Real corpora and checkpoint fetched by jaxlm.corpora (uses the default cache; the first run downloads)."""
import pathlib

import pytest

from jaxlm.corpora import download, models, registry
from jaxlm.corpora.text import split_sentences

FIRST_SENTENCE = (
    "It is a truth universally acknowledged, that a single man in possession of a good fortune, "
    "must be in want of a wife."
)


def documents(path: pathlib.Path) -> list[list[str]]:
    text = path.read_text(encoding="utf-8")
    return [block.split("\n") for block in text.strip("\n").split("\n\n")]


@pytest.fixture(scope="module")
def corpora() -> dict[str, pathlib.Path]:
    return dict(zip(["austen", "wikipedia", "news"], registry.fetch_demo_corpus()))


@pytest.mark.parametrize(
    "text, expected",
    [
        ('"Mr. Bennet, how can you abuse your own children?" said Mrs. Bennet. "You take delight."',
         ['"Mr. Bennet, how can you abuse your own children?" said Mrs. Bennet.', '"You take delight."']),
        ('"Is it really?" She smiled. Dr. Grant and St. James came. It was 5 p.m. at most.',
         ['"Is it really?"', "She smiled.", "Dr. Grant and St. James came.", "It was 5 p.m. at most."]),
        ("He met J. R. R. Tolkien, e.g. Tolkien, i.e. Mr. Tolkien. 1066 was a year! (Really.) Yes.",
         ["He met J. R. R. Tolkien, e.g. Tolkien, i.e. Mr. Tolkien.", "1066 was a year!", "(Really.)", "Yes."]),
        ("No split here.like this, or at 3.5 or before lower case. words", ["No split here.like this, or at 3.5 or before lower case. words"]),
        ("  \n ", []),
    ],
)
def test_split_sentences(text, expected):
    assert split_sentences(text) == expected


def test_cache_dir_follows_env(monkeypatch, tmp_path):
    monkeypatch.setenv("JAXLM_CACHE", str(tmp_path / "c"))
    assert download.cache_dir() == tmp_path / "c" and (tmp_path / "c").is_dir()


def test_corpus_format(corpora):
    for name, path in corpora.items():
        assert path == download.cache_dir() / "corpora" / f"{name}.txt"
        text = path.read_text(encoding="utf-8")
        assert text.endswith("\n") and not text.startswith("\n") and "\n\n\n" not in text
        for line in text.split("\n"):
            assert line == line.strip()
            for markup in ("{{", "[[", "<ref", "|}"):
                assert markup not in line, (name, line)
        assert registry.CORPORA[name].licence


def test_austen(corpora):
    path = corpora["austen"]
    docs = documents(path)
    assert len(docs) >= 250 and path.stat().st_size > 3_500_000
    chapter_one = [doc for doc in docs if FIRST_SENTENCE in doc]
    assert len(chapter_one) == 1 and chapter_one[0][0] == FIRST_SENTENCE
    text = path.read_text(encoding="utf-8")
    for leftover in ("CHAPTER", "Chapter 1\n", "PRIDE AND PREJUDICE", "THE END", "FINIS", "_"):
        assert leftover not in text


def test_wikipedia(corpora):
    docs = documents(corpora["wikipedia"])
    assert len(docs) >= 80
    assert docs[0][0].startswith("Anarchism is a political philosophy")


def test_news(corpora):
    docs = documents(corpora["news"])
    assert len(docs) == 300
    assert docs[0][0].startswith("Hundreds of people have been forced to vacate their homes")


def test_fetch_is_idempotent(corpora):
    mtimes = {name: path.stat().st_mtime_ns for name, path in corpora.items()}
    assert registry.fetch_demo_corpus() == list(corpora.values())
    assert {name: path.stat().st_mtime_ns for name, path in corpora.items()} == mtimes


def test_minilm_checkpoint():
    directory = models.minilm_dir()
    for name in models.MINILM_FILES:
        assert (directory / name).is_file()
    vocab = models.bert_vocab_path().read_text(encoding="utf-8").split("\n")
    if vocab[-1] == "":
        vocab.pop()
    assert models.bert_vocab_path() == directory / "vocab.txt"
    assert len(vocab) == 30522
    assert (vocab[0], vocab[101], vocab[102], vocab[103]) == ("[PAD]", "[CLS]", "[SEP]", "[MASK]")


def test_download_failure_is_a_clear_error(tmp_path):
    with pytest.raises(download.FetchError, match="no-such-package-jaxlm"):
        download.pip_download("no-such-package-jaxlm==0.0.0", str(tmp_path))


def test_one_registry_names_every_corpus():
    """`demo:NAME` and `tfds:jaxlm_demo_corpus/CONFIG` both come from the registry, the config derived from the name."""
    assert list(registry.CORPORA) == ["austen", "wikipedia", "news", "kernel-docs", "python-docs"]
    assert [c.tfds_config for c in registry.CORPORA.values()] == [
        "austen", "wikipedia", "news", "kernel_docs", "python_docs"]
    for name, corpus in registry.CORPORA.items():
        assert registry.find_corpus(name) is registry.find_corpus(corpus.tfds_config) is corpus
        assert corpus.licence and corpus.homepage.startswith("https://")
    assert registry.find_corpus("poems") is None
