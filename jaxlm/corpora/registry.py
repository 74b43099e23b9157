"""The demo corpora, registered once: name (`demo:NAME`; its TFDS config name derives from it),
fetcher, licence, homepage and citation."""
from __future__ import annotations

import bz2
import dataclasses
import io
import pathlib
import tempfile
from typing import Callable

from jaxlm.corpora.austen import austen_chapters
from jaxlm.corpora.download import FetchError, apt_download, corpus_path, wheel_member, write_atomic
from jaxlm.corpora.rlazyload import read_r_lazyload
from jaxlm.corpora.rst import rst_corpus
from jaxlm.corpora.text import format_documents, split_sentences
from jaxlm.corpora.wikitext import wikipedia_documents

GENSIM = "gensim==4.4.0"
_JANEAUSTENR_DATA = "usr/lib/R/site-library/janeaustenr/data/Rdata"
_WIKI_MEMBER = "gensim/test/test_data/enwiki-latest-pages-articles1.xml-p000000010p000030302-shortened.bz2"
_NEWS_MEMBER = "gensim/test/test_data/lee_background.cor"
_KERNEL_DOCS = "usr/share/doc/linux-doc-6.12/Documentation"
_PYTHON_DOCS = "usr/share/doc/python3.11/html/_sources"


# ---------------------------------------------------------------- fetchers (each caches its corpus as BERT text)

def _from_debian(name: str, package: str, text: Callable[[pathlib.Path], str]) -> pathlib.Path:
    """Corpus `name`, cached as BERT text: `text` of Debian's `package` unpacked (downloaded once)."""
    path = corpus_path(name)
    if not path.exists():
        with tempfile.TemporaryDirectory() as tmp:
            write_atomic(path, text(apt_download(package, tmp)))
    return path


def _austen_text(root: pathlib.Path) -> str:
    data = root / _JANEAUSTENR_DATA
    novels = read_r_lazyload(data.with_suffix(".rdb").read_bytes(), data.with_suffix(".rdx").read_bytes())
    return format_documents(chapter for lines in novels.values() for chapter in austen_chapters(lines))


def fetch_austen() -> pathlib.Path:
    """Six Jane Austen novels (Debian r-cran-janeaustenr), one document per chapter."""
    return _from_debian("austen", "r-cran-janeaustenr", _austen_text)


def fetch_wikipedia() -> pathlib.Path:
    """English Wikipedia articles from gensim's test data, one document per article."""
    path = corpus_path("wikipedia")
    if path.exists():
        return path
    xml = bz2.decompress(wheel_member(GENSIM, _WIKI_MEMBER))
    return write_atomic(path, format_documents(wikipedia_documents(io.BytesIO(xml))))


def fetch_news() -> pathlib.Path:
    """The Lee background corpus (gensim's test data), one document per article."""
    path = corpus_path("news")
    if path.exists():
        return path
    articles = wheel_member(GENSIM, _NEWS_MEMBER).decode("utf-8").splitlines()
    return write_atomic(path, format_documents(split_sentences(a) for a in articles))


def _rst_text(files: list[pathlib.Path], package: str, where: str) -> str:
    if not files:
        raise FetchError(f"{package} has no reST files under {where}.")
    return rst_corpus(files)


def _kernel_docs_text(root: pathlib.Path) -> str:
    docs = root / _KERNEL_DOCS
    files = sorted(p for p in docs.rglob("*") if p.name.endswith((".rst", ".rst.gz")) and p.is_file()
                   and "translations" not in p.relative_to(docs).parts)
    return _rst_text(files, "linux-doc-6.12", _KERNEL_DOCS)


def fetch_kernel_docs() -> pathlib.Path:
    """Linux kernel documentation (Debian linux-doc-6.12): the English .rst(.gz) files, as prose."""
    return _from_debian("kernel-docs", "linux-doc-6.12", _kernel_docs_text)


def fetch_python_docs() -> pathlib.Path:
    """Python 3.11 documentation (Debian python3.11-doc): the reST sources, as prose."""
    return _from_debian("python-docs", "python3.11-doc", lambda root: _rst_text(
        sorted((root / _PYTHON_DOCS).rglob("*.rst.txt")), "python3.11-doc", _PYTHON_DOCS))


# ---------------------------------------------------------------- the registry

@dataclasses.dataclass(frozen=True)
class Corpus:
    name: str  # `demo:NAME`, and the cache file corpora/NAME.txt
    fetch: Callable[[], pathlib.Path]
    licence: str
    homepage: str = ""
    citation: str = ""

    @property
    def tfds_config(self) -> str:
        """Its config of the jaxlm_demo_corpus TFDS builder (TFDS config names take no hyphens)."""
        return self.name.replace("-", "_")


CORPORA = {corpus.name: corpus for corpus in (
    Corpus("austen", fetch_austen,
           "Six Jane Austen novels, texts in the public domain; from the Debian package r-cran-janeaustenr "
           "(R package janeaustenr, MIT-licensed packaging).",
           "https://github.com/juliasilge/janeaustenr", """@misc{silge_janeaustenr,
  author = {Julia Silge},
  title = {janeaustenr: Jane Austen's Complete Novels},
  note = {R package},
  howpublished = {\\url{https://CRAN.R-project.org/package=janeaustenr}}
}"""),
    Corpus("wikipedia", fetch_wikipedia,
           "Sample of English Wikipedia articles (enwiki-latest-pages-articles1 shortened), CC BY-SA 3.0; "
           "from the gensim 4.4.0 wheel's test data.",
           "https://github.com/piskvorky/gensim", """@misc{wikipedia,
  author = {{Wikipedia contributors}},
  title = {Wikipedia, The Free Encyclopedia},
  howpublished = {\\url{https://en.wikipedia.org}}
}"""),
    Corpus("news", fetch_news,
           "Lee background corpus: 300 news articles from the Australian Broadcasting Corporation, "
           "distributed for research use; from the gensim 4.4.0 wheel's test data.",
           "https://github.com/piskvorky/gensim", """@inproceedings{lee2005empirical,
  author = {Lee, Michael D. and Pincombe, Brandon and Welsh, Matthew},
  title = {An empirical evaluation of models of text document similarity},
  booktitle = {Proceedings of the 27th Annual Conference of the Cognitive Science Society},
  year = {2005}
}"""),
    Corpus("kernel-docs", fetch_kernel_docs,
           "Linux kernel documentation (Documentation/, English only), GPL-2.0 for the most part (some files "
           "GPL-2.0+, GFDL-1.1+ or dual-licensed; see the SPDX lines and the package's copyright file); from "
           "the Debian package linux-doc-6.12.",
           "https://docs.kernel.org/"),
    Corpus("python-docs", fetch_python_docs,
           "Python 3.11 documentation reST sources, under the PSF License Agreement (Python Software "
           "Foundation License Version 2); from the Debian package python3.11-doc.",
           "https://docs.python.org/3.11/"),
)}
DEMO = ("austen", "wikipedia", "news")  # the small default demo set


def find_corpus(name: str) -> Corpus | None:
    """The corpus called `name`, or whose TFDS config is `name` (kernel_docs for kernel-docs)."""
    return CORPORA.get(name) or next((c for c in CORPORA.values() if c.tfds_config == name), None)


def fetch_demo_corpus() -> list[pathlib.Path]:
    return [CORPORA[name].fetch() for name in DEMO]
