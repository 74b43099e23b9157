"""MediaWiki markup and XML dumps to plain prose documents."""
from __future__ import annotations

import html
import re
import xml.etree.ElementTree as ET

from jaxlm.corpora.text import split_sentences

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
